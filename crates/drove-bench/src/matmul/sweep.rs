//! The sweep on the GPU `--device` names: each case's operands made once,
//! each kernel launched, checked and timed on them, then cuBLAS.

use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Distribution, Tensor, TensorPrimitive};
use drove_device::{DeviceChoice, Gpu, Opened};
use drove_kernels::matmul::Kernel;
use drove_kernels::matmul::cube::MatmulLaunchError;

use super::{Case, CublasStatus, MatmulOptions, MatmulReport, MatmulRow, cases, tolerance};
use crate::BenchError;

/// A launch of one kernel on a backend's float tensors.
type Launch<K> = fn(FloatTensor<K>, FloatTensor<K>, Kernel) -> Result<FloatTensor<K>, MatmulLaunchError>;

/// Problems at most this many multiply-adds are checked against the f64
/// product on the host; larger ones against cubek's unit kernel (f32).
const HOST_REFERENCE_MAX: f64 = 1e8;

/// Runs the suite on `device` (a GPU).
pub fn run(options: &MatmulOptions, device: DeviceChoice) -> Result<MatmulReport, BenchError> {
    let gpu = Gpu::open(device, 0)?.ok_or_else(|| {
        BenchError::Check(
            "drove bench matmul times GPU kernels: name one with --device cuda or --device wgpu".into(),
        )
    })?;
    let kernels = if options.kernels.is_empty() { Kernel::ALL.to_vec() } else { options.kernels.clone() };
    let repeats = if options.quick { options.repeats.min(2) } else { options.repeats };
    let sweep = Sweep { cases: cases(options.quick), kernels, repeats, budget_s: options.budget_s };
    let (rows, skipped, cublas) = match gpu.opened() {
        #[cfg(feature = "cuda")]
        Opened::Cuda { ordinal, device } => {
            let cublas = super::cublas::Cublas::open(*ordinal);
            let status = CublasStatus { available: cublas.is_ok(), reason: cublas.as_ref().err().cloned() };
            let launch: Launch<drove_kernels::backends::CudaCube> = drove_kernels::matmul::cube::launch;
            let (rows, skipped) =
                sweep.run::<drove_kernels::backends::CudaCube>(device, launch, cublas.ok().as_ref())?;
            (rows, skipped, status)
        }
        #[cfg(feature = "wgpu")]
        Opened::Wgpu(opened) => {
            let launch: Launch<drove_kernels::backends::Wgpu> = drove_kernels::matmul::cube::launch;
            let (rows, skipped) = sweep.run::<drove_kernels::backends::Wgpu>(&opened.device, launch, None)?;
            (rows, skipped, CublasStatus { available: false, reason: Some("not a CUDA device".into()) })
        }
    };
    Ok(MatmulReport {
        benchmark: "matmul",
        device: gpu.describe(),
        quick: options.quick,
        repeats,
        rows,
        skipped,
        cublas,
    })
}

#[cfg(feature = "cuda")]
type Cublas = super::cublas::Cublas;
#[cfg(not(feature = "cuda"))]
type Cublas = std::convert::Infallible;

/// What is swept.
struct Sweep {
    cases: Vec<Case>,
    kernels: Vec<Kernel>,
    repeats: usize,
    budget_s: f64,
}

/// One case's operands: as stored, the views the kernels read, and the
/// reference product.
struct Operands<K: Backend> {
    lhs: FloatTensor<K>,
    rhs: FloatTensor<K>,
    stored: Option<(Vec<f32>, Vec<f32>)>,
    reference: Option<Vec<f32>>,
}

impl Sweep {
    fn run<K: Backend>(
        &self,
        device: &K::Device,
        launch: Launch<K>,
        cublas: Option<&Cublas>,
    ) -> Result<(Vec<MatmulRow>, usize), BenchError> {
        let start = Instant::now();
        let mut rows = Vec::new();
        for (i, case) in self.cases.iter().enumerate() {
            if start.elapsed().as_secs_f64() > self.budget_s {
                return Ok((rows, self.cases.len() - i));
            }
            let operands = operands::<K>(case, device, launch, cublas.is_some());
            for &kernel in &self.kernels {
                rows.push(self.time(case, &operands, kernel, device, launch)?);
            }
            #[cfg(feature = "cuda")]
            if let (Some(cublas), Some((lhs, rhs))) = (cublas, &operands.stored) {
                for tf32 in [false, true] {
                    rows.push(cublas_row(case, cublas, lhs, rhs, tf32, self.repeats, &operands.reference));
                }
            }
        }
        Ok((rows, 0))
    }

    /// `kernel` on `case`: launched once, checked, then timed.
    fn time<K: Backend>(
        &self,
        case: &Case,
        operands: &Operands<K>,
        kernel: Kernel,
        device: &K::Device,
        launch: Launch<K>,
    ) -> Result<MatmulRow, BenchError> {
        let precision = if kernel.uses_tensor_cores() { "tf32" } else { "f32" };
        let mut row = row(case, kernel.name().to_string(), precision);
        let go = || launch(operands.lhs.clone(), operands.rhs.clone(), kernel);
        let first = match go() {
            Ok(out) => out,
            Err(e) => {
                row.error = Some(e.to_string());
                return Ok(row);
            }
        };
        let values = read::<K>(first);
        check(&mut row, &values, operands.reference.as_deref());
        let sync = |what| {
            K::sync(device).map_err(|e| BenchError::Check(format!("{what}: waiting for the GPU: {e:?}")))
        };
        sync("before timing")?;
        let start = Instant::now();
        for _ in 0..self.repeats {
            go().map_err(|e| {
                BenchError::Check(format!("{} launched once, then failed: {e}", kernel.name()))
            })?;
        }
        sync("after timing")?;
        set_time(&mut row, case, start.elapsed().as_secs_f64() * 1e6 / self.repeats as f64);
        Ok(row)
    }
}

/// A row of `case` with nothing measured yet.
fn row(case: &Case, strategy: String, precision: &'static str) -> MatmulRow {
    let g = case.gemm;
    MatmulRow {
        class: case.class.clone(),
        sentences: case.sentences,
        seq: case.seq,
        m: g.m,
        n: g.n,
        k: g.k,
        batch: g.batch,
        transposed: case.transposed(),
        strategy,
        precision,
        mean_us: None,
        tflops: None,
        max_rel_diff: None,
        matched: false,
        error: None,
    }
}

fn set_time(row: &mut MatmulRow, case: &Case, mean_us: f64) {
    row.mean_us = Some(mean_us);
    row.tflops = Some(case.gemm.flops() / (mean_us * 1e-6) / 1e12);
}

fn check(row: &mut MatmulRow, values: &[f32], reference: Option<&[f32]>) {
    if let Some(reference) = reference {
        let off = relative_diff(values, reference);
        row.max_rel_diff = Some(off);
        row.matched = off <= tolerance(row.precision);
    }
}

#[cfg(feature = "cuda")]
fn cublas_row(
    case: &Case,
    cublas: &Cublas,
    lhs: &[f32],
    rhs: &[f32],
    tf32: bool,
    repeats: usize,
    reference: &Option<Vec<f32>>,
) -> MatmulRow {
    let (name, precision) = if tf32 { ("cublas_tf32", "tf32") } else { ("cublas_sgemm", "f32") };
    let mut row = row(case, name.into(), precision);
    match cublas.time(case, lhs, rhs, tf32, repeats) {
        Ok(timed) => {
            check(&mut row, &timed.result, reference.as_deref());
            set_time(&mut row, case, timed.mean_us);
        }
        Err(e) => row.error = Some(e),
    }
    row
}

/// Uniform values in [-1, 1) on the device: the operands as stored, their
/// (possibly transposed) views, and the reference product.
fn operands<K: Backend>(
    case: &Case,
    device: &K::Device,
    launch: Launch<K>,
    keep_stored: bool,
) -> Operands<K> {
    let g = case.gemm;
    let make = |dims: [usize; 3]| Tensor::<K, 3>::random(dims, Distribution::Uniform(-1.0, 1.0), device);
    let lhs = make(if case.lhs_transposed { [g.batch, g.k, g.m] } else { [g.batch, g.m, g.k] });
    let rhs = make(if case.rhs_transposed { [g.batch, g.n, g.k] } else { [g.batch, g.k, g.n] });
    let host_reference = g.flops() / 2.0 <= HOST_REFERENCE_MAX;
    let stored = (keep_stored || host_reference).then(|| (values(lhs.clone()), values(rhs.clone())));
    let view = |t: Tensor<K, 3>, transposed: bool| if transposed { t.swap_dims(1, 2) } else { t };
    let lhs = view(lhs, case.lhs_transposed).into_primitive().tensor();
    let rhs = view(rhs, case.rhs_transposed).into_primitive().tensor();
    let reference = match (&stored, host_reference) {
        (Some((a, b)), true) => Some(host_product(case, a, b)),
        _ => launch(lhs.clone(), rhs.clone(), Kernel::SimpleUnit).ok().map(read::<K>),
    };
    let stored = if keep_stored { stored } else { None };
    Operands { lhs, rhs, stored, reference }
}

fn values<K: Backend>(t: Tensor<K, 3>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap_or_default()
}

fn read<K: Backend>(t: FloatTensor<K>) -> Vec<f32> {
    values(Tensor::<K, 3>::from_primitive(TensorPrimitive::Float(t)))
}

/// The product in f64 on the host from the operands as stored.
fn host_product(case: &Case, lhs: &[f32], rhs: &[f32]) -> Vec<f32> {
    let g = case.gemm;
    let a = |b: usize, i: usize, p: usize| {
        if case.lhs_transposed { lhs[(b * g.k + p) * g.m + i] } else { lhs[(b * g.m + i) * g.k + p] }
    };
    let r = |b: usize, p: usize, j: usize| {
        if case.rhs_transposed { rhs[(b * g.n + j) * g.k + p] } else { rhs[(b * g.k + p) * g.n + j] }
    };
    let mut out = Vec::with_capacity(g.batch * g.m * g.n);
    for b in 0..g.batch {
        for i in 0..g.m {
            for j in 0..g.n {
                let sum: f64 = (0..g.k).map(|p| f64::from(a(b, i, p)) * f64::from(r(b, p, j))).sum();
                out.push(sum as f32);
            }
        }
    }
    out
}

/// Largest difference over the largest magnitude of `reference` (infinite
/// when the lengths differ or a value is not a number).
fn relative_diff(values: &[f32], reference: &[f32]) -> f64 {
    if values.len() != reference.len() {
        return f64::INFINITY;
    }
    let scale = reference.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs())).max(f64::MIN_POSITIVE);
    let off = |(&a, &b): (&f32, &f32)| match f64::from(a - b).abs() {
        d if d.is_nan() => f64::INFINITY,
        d => d,
    };
    values.iter().zip(reference).map(off).fold(0f64, f64::max) / scale
}

//! cuBLAS's `sgemm` (and with TF32 allowed) through cudarc, as the
//! reference of the matmul suite: on its own context and stream, operands
//! uploaded from the host in the layout the cubek kernels read, timed with a
//! sync around the repetitions. A reference only: burn 0.21 has no way to
//! order cuBLAS's stream after its own (see GPU-SPEED.md, Q4 (a)).
//!
//! libcublas is loaded at run time; where it is missing, [`Cublas::open`]
//! says so (no panic), and the suite reports it in its JSON.

use std::sync::Arc;
use std::time::Instant;

use cudarc::cublas::sys::{cublasMath_t, cublasOperation_t};
use cudarc::cublas::{CudaBlas, Gemm as _, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};

use super::Case;

/// cuBLAS on one GPU.
pub struct Cublas {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
}

/// One timed product: the mean time a launch and the result (row-major).
pub struct Timed {
    /// Mean time a launch, microseconds.
    pub mean_us: f64,
    /// `[batch, m, n]`, row-major.
    pub result: Vec<f32>,
}

impl Cublas {
    /// cuBLAS on GPU `ordinal`, or why not (no CUDA driver, no libcublas).
    pub fn open(ordinal: usize) -> Result<Cublas, String> {
        // SAFETY: only tries to load the libraries, calls nothing in them.
        let (driver, cublas) =
            unsafe { (cudarc::driver::sys::is_culib_present(), cudarc::cublas::sys::is_culib_present()) };
        if !driver {
            return Err("the CUDA driver library (libcuda) does not load".into());
        }
        if !cublas {
            return Err(format!(
                "libcublas does not load (tried {}; LD_LIBRARY_PATH names where it is)",
                cudarc::get_lib_name_candidates("cublas").join(", ")
            ));
        }
        let context =
            CudaContext::new(ordinal).map_err(|e| format!("opening cuda:{ordinal} for cuBLAS: {e}"))?;
        let stream = context.default_stream();
        let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("creating a cuBLAS handle: {e}"))?;
        Ok(Cublas { stream, blas })
    }

    /// Times `case` on operands `lhs` and `rhs` as stored (`[batch, k, m]`
    /// for a transposed left operand, `[batch, m, k]` otherwise; `[batch, n,
    /// k]` for a transposed right one, `[batch, k, n]` otherwise), with TF32
    /// allowed or not.
    pub fn time(
        &self,
        case: &Case,
        lhs: &[f32],
        rhs: &[f32],
        tf32: bool,
        repeats: usize,
    ) -> Result<Timed, String> {
        let a = self.stream.clone_htod(lhs).map_err(fail("upload"))?;
        let b = self.stream.clone_htod(rhs).map_err(fail("upload"))?;
        let g = case.gemm;
        let mut c: CudaSlice<f32> =
            self.stream.alloc_zeros(g.batch * g.m * g.n).map_err(fail("allocation"))?;
        let mode =
            if tf32 { cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH } else { cublasMath_t::CUBLAS_DEFAULT_MATH };
        // SAFETY: a handle this struct owns and a valid mode.
        let status = unsafe { cudarc::cublas::sys::cublasSetMathMode(*self.blas.handle(), mode) };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(format!("cublasSetMathMode: {status:?}"));
        }
        let config = config(case);
        let mut launch = || -> Result<(), String> {
            // SAFETY: the buffers hold batch x the sizes `config` reads and
            // writes (from the same case).
            unsafe { self.blas.gemm_strided_batched(config, &b, &a, &mut c) }
                .map_err(|e| format!("cuBLAS sgemm: {e}"))
        };
        launch()?;
        self.stream.synchronize().map_err(fail("sync"))?;
        let start = Instant::now();
        for _ in 0..repeats {
            launch()?;
        }
        self.stream.synchronize().map_err(fail("sync"))?;
        let mean_us = start.elapsed().as_secs_f64() * 1e6 / repeats as f64;
        let result = self.stream.clone_dtoh(&c).map_err(fail("read back"))?;
        Ok(Timed { mean_us, result })
    }
}

/// A driver error of cuBLAS's `what`, in words.
fn fail(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> String {
    move |e| format!("cuBLAS {what}: {e}")
}

/// The row-major product `C = A B` as cuBLAS's column-major `C^T = B^T A^T`:
/// the right operand first, each transposed or not as it is stored.
fn config(case: &Case) -> StridedBatchedConfig<f32> {
    let g = case.gemm;
    let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    let int = |x: usize| x as i32;
    StridedBatchedConfig {
        gemm: GemmConfig {
            transa: op(case.rhs_transposed),
            transb: op(case.lhs_transposed),
            m: int(g.n),
            n: int(g.m),
            k: int(g.k),
            alpha: 1.0,
            lda: int(if case.rhs_transposed { g.k } else { g.n }),
            ldb: int(if case.lhs_transposed { g.m } else { g.k }),
            beta: 0.0,
            ldc: int(g.n),
        },
        batch_size: int(g.batch),
        stride_a: (g.k * g.n) as i64,
        stride_b: (g.m * g.k) as i64,
        stride_c: (g.m * g.n) as i64,
    }
}

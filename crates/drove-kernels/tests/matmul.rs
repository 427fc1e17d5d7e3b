//! drove's matmul on lavapipe (Mesa's software Vulkan), unfused and through
//! burn's fusion: forward and both gradients against burn's own matmul on
//! the same backend, for the shapes of a BERT step, and f32 held against an
//! f64 reference on a problem where TF32 would be about 5e-4 off.
//!
//! lavapipe has no tensor cores: cubek's CMMA kernels are unavailable there,
//! so burn's default and drove's table both run cubek's unit kernel (f32),
//! and the products must be equal bit for bit. Where lavapipe is missing
//! each test says so and passes without running.
#![cfg(feature = "wgpu")]

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use cubecl::wgpu::WgpuDevice;
use drove_kernels::backends::{Wgpu, WgpuFused};
use drove_kernels::matmul::{Precision, matmul};

/// The wgpu device on lavapipe, or `None` after saying why the tests skip.
fn lavapipe() -> Option<WgpuDevice> {
    drove_kernels::testing::wgpu_device_or_skip()
}

/// Deterministic values in [-1, 1) (a 32-bit LCG), `len` of them.
fn values(len: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

fn tensor<B: Backend, const D: usize>(shape: [usize; D], seed: u32, device: &B::Device) -> Tensor<B, D> {
    let len = shape.iter().product();
    Tensor::from_data(TensorData::new(values(len, seed), shape), device)
}

fn read<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// Largest difference over the largest magnitude of `reference`.
fn relative_diff(ours: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs())).max(f64::MIN_POSITIVE);
    ours.iter().zip(reference).fold(0f64, |m, (&a, &b)| m.max(f64::from(a - b).abs())) / scale
}

/// A product of the model's shapes: the operands (made by `make`, which may
/// transpose one) and their gradients, by drove's matmul and by burn's.
struct Compared {
    what: &'static str,
    forward: (Vec<f32>, Vec<f32>),
    lhs_grad: (Vec<f32>, Vec<f32>),
    rhs_grad: (Vec<f32>, Vec<f32>),
}

/// Runs `lhs x rhs` both ways on `Autodiff<B>` with a loss weighting every
/// output element differently (so a gradient sent to the wrong place shows).
fn compare<B: Backend, const D: usize>(
    what: &'static str,
    lhs: Tensor<Autodiff<B>, D>,
    rhs: Tensor<Autodiff<B>, D>,
    precision: Precision,
) -> Compared {
    let (lhs, rhs) = (lhs.require_grad(), rhs.require_grad());
    let run = |ours: bool| {
        let product =
            if ours { matmul(lhs.clone(), rhs.clone(), precision) } else { lhs.clone().matmul(rhs.clone()) };
        let weights = tensor::<Autodiff<B>, D>(product.dims(), 99, &product.device());
        let grads = (product.clone() * weights).sum().backward();
        (read(product), read(lhs.grad(&grads).unwrap()), read(rhs.grad(&grads).unwrap()))
    };
    let (ours, theirs) = (run(true), run(false));
    Compared { what, forward: (ours.0, theirs.0), lhs_grad: (ours.1, theirs.1), rhs_grad: (ours.2, theirs.2) }
}

/// The kinds of product in a BERT step, on `B`.
fn model_shapes<B: Backend>(device: &B::Device, precision: Precision) -> Vec<Compared> {
    type A<B> = Autodiff<B>;
    vec![
        compare(
            "2-D dense",
            tensor::<A<B>, 2>([12, 8], 1, device),
            tensor::<A<B>, 2>([8, 5], 2, device),
            precision,
        ),
        // A dense layer on [batch, seq, in] x [1, in, out]: the weight's
        // gradient is summed over the broadcast batch.
        compare(
            "3-D dense, weight broadcast",
            tensor::<A<B>, 3>([3, 6, 8], 3, device),
            tensor::<A<B>, 3>([1, 8, 5], 4, device),
            precision,
        ),
        // Attention scores: q x k^T, k transposed in place (a view).
        compare(
            "4-D attention, k transposed",
            tensor::<A<B>, 4>([2, 3, 6, 4], 5, device),
            tensor::<A<B>, 4>([2, 3, 6, 4], 6, device).swap_dims(2, 3),
            precision,
        ),
    ]
}

/// Every product equal to burn's bit for bit (the same unit kernel on
/// lavapipe), which also holds it within 1e-5 relative.
fn assert_same(backend: &str, precision: Precision, compared: &[Compared]) {
    for c in compared {
        for (part, (ours, theirs)) in
            [("forward", &c.forward), ("lhs gradient", &c.lhs_grad), ("rhs gradient", &c.rhs_grad)]
        {
            let off = relative_diff(ours, theirs);
            assert!(off <= 1e-5, "{backend} {precision} {}: {part} {off:e} from burn's", c.what);
            assert_eq!(ours, theirs, "{backend} {precision} {}: {part} not bit for bit burn's", c.what);
        }
    }
}

#[test]
fn unfused_forward_and_gradients_equal_burns() {
    let Some(device) = lavapipe() else { return };
    for precision in Precision::ALL {
        assert_same("wgpu", precision, &model_shapes::<Wgpu>(&device, precision));
    }
}

#[test]
fn fused_forward_and_gradients_equal_burns() {
    let Some(device) = lavapipe() else { return };
    for precision in Precision::ALL {
        assert_same("wgpu fused", precision, &model_shapes::<WgpuFused>(&device, precision));
    }
}

/// `x` rounded to TF32 (10 mantissa bits, to nearest even), as tensor cores
/// read f32 operands.
fn tf32(x: f32) -> f32 {
    let bits = x.to_bits();
    let round = 0xfff + ((bits >> 13) & 1);
    f32::from_bits((bits + round) & !0x1fff)
}

/// `[m, k] x [k, n]` in f64 on the host, the operands first mapped by `f`.
fn host_product(lhs: &[f32], rhs: &[f32], (m, k, n): (usize, usize, usize), f: fn(f32) -> f32) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let sum: f64 = (0..k).map(|p| f64::from(f(lhs[i * k + p])) * f64::from(f(rhs[p * n + j]))).sum();
            out[i * n + j] = sum as f32;
        }
    }
    out
}

#[test]
fn f32_holds_an_f64_reference_where_tf32_would_be_5e_4_off() {
    let Some(device) = lavapipe() else { return };
    let (m, k, n) = (32, 256, 24);
    // 1 + u with u in [0, 2^-11): TF32 rounds every operand down to 1, a
    // systematic 2.4e-4 on each, 4.9e-4 on each product and on the sum.
    let near_one =
        |len, seed| values(len, seed).into_iter().map(|v| 1.0 + (v + 1.0) / 4096.0).collect::<Vec<f32>>();
    let (lhs, rhs) = (near_one(m * k, 7), near_one(k * n, 8));
    let exact = host_product(&lhs, &rhs, (m, k, n), |x| x);
    let as_tf32 = host_product(&lhs, &rhs, (m, k, n), tf32);
    let tf32_off = relative_diff(&as_tf32, &exact);
    assert!(tf32_off > 3e-4, "the problem does not tell TF32 from f32: TF32 is {tf32_off:e} off");
    let a = Tensor::<Wgpu, 2>::from_data(TensorData::new(lhs, [m, k]), &device);
    let b = Tensor::<Wgpu, 2>::from_data(TensorData::new(rhs, [k, n]), &device);
    let product = read(matmul(a, b, Precision::F32));
    let off = relative_diff(&product, &exact);
    eprintln!("f32 on lavapipe: {off:e} from f64 (TF32 emulated on the host: {tf32_off:e})");
    assert!(off < 1e-5, "drove's f32 matmul is {off:e} from the f64 product");
}

//! Dropout drawn on the device, on a wgpu adapter (lavapipe here): the
//! kernel's masks are the host's bit for bit, through burn's unfused and fused
//! wgpu backends (the CUDA build is fused), forward and backward.
#![cfg(feature = "wgpu")]

mod common;

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use drove_kernels::backends::{Wgpu, WgpuFused};
use drove_kernels::dropout::{Mask, masked};

use common::{bits, device_or_skip, values};

/// Every mask compared: 2-D, 3-D and 4-D shapes (the last like attention
/// probabilities `[batch, heads, L, L]`) with odd row lengths, several seeds,
/// calls and first rows (a micro-batch of a larger batch), and keeps.
fn forward_matches_the_host<B: Backend>(device: &B::Device) {
    let mask = |seed, call, first_row, keep| Mask { seed, call, first_row, keep };
    check::<B, 2>(device, [3, 7], mask(7, 0, 0, 0.9));
    check::<B, 3>(device, [2, 5, 3], mask(0xDEAD_BEEF_0123_4567, 5, 3, 0.5));
    check::<B, 4>(device, [2, 3, 4, 4], mask(u64::MAX, 19, 1, 0.9));
    check::<B, 3>(device, [4, 1, 9], mask(42, 2, (1 << 33) - 2, 0.25));
}

/// Distinct inputs of either sign, so that the product is checked too.
fn input(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0 + 0.1).collect()
}

/// `x * mask` as the host path computes it.
fn host(x: &[f32], dims: &[usize], mask: &Mask) -> Vec<f32> {
    let (rows, per_row) = Mask::rows_of(dims);
    x.iter().zip(mask.host_values(rows, per_row)).map(|(x, m)| x * m).collect()
}

/// The device's `x * mask` on backend `B` against the host's, bit for bit.
fn check<B: Backend, const D: usize>(device: &B::Device, dims: [usize; D], mask: Mask) {
    let x = input(dims.iter().product());
    let got =
        values(device_masked(Tensor::<B, D>::from_data(TensorData::new(x.clone(), dims), device), mask));
    let want = host(&x, &dims, &mask);
    assert!(want.contains(&0.0), "{dims:?} {mask:?}: nothing dropped, a weak case");
    assert_eq!(bits(&got), bits(&want), "{dims:?} {mask:?}: device {got:?}, host {want:?}");
}

fn device_masked<B: Backend, const D: usize>(x: Tensor<B, D>, mask: Mask) -> Tensor<B, D> {
    masked(x, mask).unwrap_or_else(|_| panic!("{} has drove's kernels", std::any::type_name::<B>()))
}

#[test]
fn the_unfused_backend_draws_the_host_masks() {
    let Some(device) = device_or_skip() else { return };
    forward_matches_the_host::<Wgpu>(&device);
}

#[test]
fn the_fused_backend_draws_the_host_masks() {
    let Some(device) = device_or_skip() else { return };
    forward_matches_the_host::<WgpuFused>(&device);
}

/// Under autodiff: the output is `x * mask` and the gradient of
/// `sum(output * w)` is `w * mask`, the mask recomputed in backward.
fn backward_applies_the_same_mask<B: Backend>(device: &B::Device) {
    let dims = [3usize, 2, 5];
    let mask = Mask { seed: 99, call: 3, first_row: 2, keep: 0.6 };
    let (x, w) = (input(30), input(30).iter().map(|v| v * 0.5 - 1.0).collect::<Vec<_>>());
    let tensor = |v: &[f32]| Tensor::<Autodiff<B>, 3>::from_data(TensorData::new(v.to_vec(), dims), device);
    let xs = tensor(&x).require_grad();
    let y = device_masked(xs.clone(), mask);
    let grads = (y.clone() * tensor(&w)).sum().backward();
    let grad = values(xs.grad(&grads).expect("x has a gradient"));
    assert_eq!(bits(&values(y)), bits(&host(&x, &dims, &mask)), "forward");
    assert_eq!(bits(&grad), bits(&host(&w, &dims, &mask)), "gradient");
}

#[test]
fn the_gradient_is_the_same_mask_unfused() {
    let Some(device) = device_or_skip() else { return };
    backward_applies_the_same_mask::<Wgpu>(&device);
}

#[test]
fn the_gradient_is_the_same_mask_fused() {
    let Some(device) = device_or_skip() else { return };
    backward_applies_the_same_mask::<WgpuFused>(&device);
}

//! drove-bert's `dropout` on a wgpu adapter (lavapipe here): the masks the
//! device draws are those the host draws for the same stream, bit for bit,
//! forward and backward, through burn's unfused and fused wgpu backends, and
//! the device path uploads nothing.
#![cfg(feature = "wgpu")]

use burn::backend::Autodiff;
use burn::nn::DropoutConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use drove_bert::{Masks, dropout, seed_dropout_rows, set_dropout_masks};
use drove_kernels::backends::{Wgpu, WgpuFused};
use drove_kernels::transfer;

/// The outputs and input gradients of a small forward pass with three
/// dropout calls (2-D, 3-D and 4-D, as the model's embeddings, residual
/// branches and attention probabilities), drawn with `masks`, and the uploads
/// drove counted on the way.
fn run<B: Backend>(device: &B::Device, masks: Masks) -> (Vec<u32>, Vec<u32>, u64) {
    set_dropout_masks(masks);
    let layer = DropoutConfig::new(0.1).init();
    let values = |n: usize| (0..n).map(|i| (i as f32 * 0.61).cos() + 0.05).collect::<Vec<_>>();
    let x =
        Tensor::<Autodiff<B>, 3>::from_data(TensorData::new(values(60), [3, 4, 5]), device).require_grad();
    let before = transfer::transfers();
    // A micro-batch from row 2 of its batch, three calls of its forward pass.
    seed_dropout_rows(7, 2);
    let flat = dropout(&layer, x.clone().reshape([3, 20]));
    let middle = dropout(&layer, flat.reshape([3, 4, 5]));
    let out = dropout(&layer, middle.reshape([3, 2, 2, 5]));
    let uploads = (transfer::transfers() - before).uploads;
    let weights = Tensor::<Autodiff<B>, 4>::from_data(TensorData::new(values(60), [3, 2, 2, 5]), device);
    let grads = (out.clone() * weights).sum().backward();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let read = |t: Tensor<B, 3>| t.into_data().convert::<f32>().into_vec::<f32>().unwrap();
    let out = bits(out.into_data().convert::<f32>().into_vec::<f32>().unwrap());
    (out, bits(read(x.grad(&grads).expect("x has a gradient"))), uploads)
}

fn device_and_host_agree<B: Backend>(device: &B::Device) {
    let (out, grad, uploads) = run::<B>(device, Masks::Device);
    let (host_out, host_grad, host_uploads) = run::<B>(device, Masks::Host);
    let name = std::any::type_name::<B>();
    assert_eq!(host_uploads, 3, "{name}: the host path uploads each of its three masks");
    assert_eq!(uploads, 0, "{name}: the device path uploads no mask");
    assert_eq!(out, host_out, "{name}: the forward outputs differ");
    assert_eq!(grad, host_grad, "{name}: the gradients differ");
    assert!(out.contains(&0), "{name}: something was dropped");
}

/// One test, so that the process-wide setting is switched by it alone (and
/// the environment changed while no other thread reads it).
#[test]
fn the_device_draws_the_host_masks_and_uploads_none() {
    let Some(device) = drove_kernels::testing::wgpu_device_or_skip() else { return };
    device_and_host_agree::<Wgpu>(&device);
    device_and_host_agree::<WgpuFused>(&device);
    set_dropout_masks(Masks::Device);
}

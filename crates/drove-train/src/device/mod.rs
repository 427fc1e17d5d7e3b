//! The backend placement's parts: gradients and AdamW state as tensors on the
//! backend's device.
//!
//! Gradients are taken from burn's `GradientsParams` as flat 1-D tensors (a
//! reshape, no copy), summed over micro-batches and passes on the device, and
//! averaged through the replica's one door, which hands them with the
//! bucket plan to drove-device's seam,
//! [`BucketAllReduce`](drove_device::BucketAllReduce): host staging
//! (each bucket packed, copied to one host buffer, all-reduced through the
//! collective and copied back), or a device collective (NCCL) on the buckets'
//! device memory. Clipping and [`DeviceAdamW`] run in burn ops over one flat buffer for
//! every parameter (`optim`): the maths of
//! [`crate::flat::FlatAdamW`], element for element, so both placements take
//! the same step, in a handful of kernels instead of a dozen per parameter.
//!
//! Host syncs left on this path: the step's losses and the global gradient
//! norm, read together once the update is queued (one blocking read a step
//! in a world of one: [`LossRead`](crate::LossRead)).

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

/// Takes every float gradient of `model` out of `grads` as a flat 1-D tensor
/// on the device, in module order (zeros for a parameter that got none).
pub fn take_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    device: &B::Device,
) -> Vec<Tensor<B::InnerBackend, 1>> {
    struct Take<'a, B: AutodiffBackend> {
        grads: &'a mut GradientsParams,
        device: &'a B::Device,
        out: Vec<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Take<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let numel: usize = param.val().dims().iter().product();
            let grad = match self.grads.remove::<B::InnerBackend, D>(param.id) {
                Some(g) => g.reshape([numel]),
                None => Tensor::zeros([numel], self.device),
            };
            self.out.push(grad);
        }
    }
    let mut take = Take::<B> { grads, device, out: Vec::new() };
    model.visit(&mut take);
    take.out
}

mod optim;
pub use optim::{DeviceAdamW, clip_global_norm, flatten, global_norm, scalar};

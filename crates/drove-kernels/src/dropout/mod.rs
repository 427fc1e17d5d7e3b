//! Dropout drawn on the device: each element's mask value computed by a
//! CubeCL kernel from the same SplitMix64 stream of (seed, call, row) as the
//! host draws ([`Mask::host_values`]), so the device and the host give the
//! same masks bit for bit, and micro-batches and ranks still agree.
//!
//! [`masked`] is the entry for code generic over its backend: on the
//! backends of [`crate::backends`] it returns `x * mask` computed in one
//! kernel, on others it hands `x` back for the host path. As burn
//! operations ([`DropoutBackend`]): on burn-cubecl's backend a plain launch,
//! under fusion a custom operation of the fusion stream, under autodiff a
//! backward step that recomputes the mask from its key rather than keeping
//! it.

mod autodiff;
mod backend;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod fusion;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod kernel;
mod mask;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

pub use backend::DropoutBackend;
pub use mask::Mask;

use crate::backends::{Kernels, OnKernels, Same, dispatch};

/// `x * mask` computed on the device when `B` is one of drove's GPU
/// backends; otherwise `Err(x)`, unchanged, for the host path. A tensor of
/// more than `u32::MAX` elements (the kernel's 32-bit index) is handed back
/// too.
pub fn masked<B: Backend, const D: usize>(x: Tensor<B, D>, mask: Mask) -> Result<Tensor<B, D>, Tensor<B, D>> {
    struct DropoutCall<B: Backend, const D: usize>(Tensor<B, D>, Mask);

    impl<B: Backend, const D: usize> OnKernels<B> for DropoutCall<B, D> {
        type Output = Tensor<B, D>;

        fn run<K: Kernels>(self, same: Same<B, K>) -> Tensor<B, D> {
            let x: Tensor<K, D> = same.to(self.0);
            let output = K::masked(x.into_primitive().tensor(), self.1);
            same.back(Tensor::from_primitive(TensorPrimitive::Float(output)))
        }
    }

    if x.shape().num_elements() > u32::MAX as usize {
        return Err(x);
    }
    dispatch(DropoutCall(x, mask)).map_err(|call| call.0)
}

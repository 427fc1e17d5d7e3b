//! Tensors packed end to end into one buffer in one launch (issue 49, step
//! 6): drove's gradients, flattened, into the flat buffer that the clip,
//! AdamW and the all-reduce buckets read.
//!
//! burn's `cat` on burn-cubecl is the backend's default `float_cat`
//! (burn-backend 0.21 `backend/ops/tensor.rs:1351`, `cat_with_slice_assign`
//! in `backend/ops/cat.rs:8-40`), which burn-cubecl does not override: an
//! empty output, then one `slice_assign` a part (`cat.rs:25-37`), and each is
//! a launch of burn-cubecl's `slice_assign_kernel`
//! (`kernel/index/slice_assign.rs:98-180`, the launch at line 167). Under
//! fusion, `cat` is one operation of the stream that runs the inner
//! backend's (burn-fusion `ops/tensor.rs:1871-1906`), so the same launches.
//! For MiniLM's 104 parameters, 104 launches a pack.
//!
//! Here one kernel copies a group of parts, each part a buffer bound to it
//! (a comptime sequence of tensors; their places are run-time scalars, so
//! one kernel is compiled for each number of parts, not for each set of
//! sizes). A group has at most [`MAX_GROUP`] parts, fewer on a device that
//! binds fewer buffers to a kernel (`cube.rs`); MiniLM's 104 gradients are
//! 4 launches.
//!
//! [`concat()`] is the entry for code generic over its backend: on the
//! backends of [`crate::backends`] (and `Autodiff` over each) it runs
//! [`PackBackend::pack`]; on others (the CPU) it is burn's `cat`. As burn
//! operations, by backend: on burn-cubecl's, the launches; under fusion a
//! custom operation of the stream with the parts as inputs; under autodiff
//! the inner backend's pack as a constant (no gradient flows through it).

mod autodiff;
mod backend;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod fusion;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod kernel;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

pub use backend::PackBackend;

use crate::backends::{Kernels, OnKernels, Same, dispatch};

/// The most parts one launch copies: 32 buffers bound to a kernel, besides
/// the output and cubecl's metadata. CUDA binds 1024 (cubecl-cuda's
/// `CUDA_MAX_BINDINGS`); wgpu binds what the adapter allows for storage
/// buffers in a shader stage (cubecl-wgpu requests the adapter's limits, and
/// keeps one for wgpu), so a device that allows fewer gets smaller groups.
/// 32 bounds the code of one kernel (its loop over the parts is unrolled)
/// and the comparisons each cube makes to find its part.
pub const MAX_GROUP: usize = 32;

/// `parts` end to end in one 1-D tensor: `Tensor::cat(parts, 0)`, the same
/// values bit for bit, in one launch for each [`MAX_GROUP`] parts on drove's
/// GPU backends (burn's `cat` launches one copy a part); `parts[0]` itself
/// when it is the only one. On other backends (the CPU), and for a total of
/// more than `u32::MAX / 2` elements (the kernel's 32-bit places), burn's
/// `cat`. Not tracked under autodiff on the GPU backends (packed gradients
/// need no gradient).
///
/// # Panics
/// If `parts` is empty, or (as `cat`) its parts are on different devices.
pub fn concat<B: Backend>(parts: Vec<Tensor<B, 1>>) -> Tensor<B, 1> {
    struct PackCall<B: Backend>(Vec<Tensor<B, 1>>);

    impl<B: Backend> OnKernels<B> for PackCall<B> {
        type Output = Tensor<B, 1>;

        fn run<K: Kernels>(self, same: Same<B, K>) -> Tensor<B, 1> {
            let parts = self.0.into_iter().map(|p| same.to(p).into_primitive().tensor()).collect();
            same.back(Tensor::<K, 1>::from_primitive(TensorPrimitive::Float(K::pack(parts))))
        }
    }

    assert!(!parts.is_empty(), "concat needs at least one part");
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let total: usize = parts.iter().map(|p| p.dims()[0]).sum();
    if total > (u32::MAX / 2) as usize {
        return Tensor::cat(parts, 0);
    }
    dispatch(PackCall(parts)).unwrap_or_else(|call| Tensor::cat(call.0, 0))
}

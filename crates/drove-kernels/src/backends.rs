//! The GPU backends drove trains on, named once, and the run-time dispatch
//! that lets code generic over `B: Backend` run drove's kernels on them.
//!
//! drove-device's `cuda::Cuda` and `wgpu::Wgpu` are these types (aliases of
//! them), so a kernel written here for [`Cuda`] is the one a CUDA run takes.
//! [`WgpuFused`] is no run's backend: it puts burn's fusion, which the CUDA
//! build has, over wgpu, so that a test on lavapipe goes through the fused
//! path of a kernel as a CUDA run does.
//!
//! The model stays generic over its backend, with no trait bound for drove's
//! kernels: [`dispatch`] compares the backend's type at run time with each of
//! the types listed here (and `Autodiff` over each), and on a match runs the
//! call on that concrete type, as [`Kernels`]; otherwise it hands the call
//! back for the caller's generic path (burn's operations, or the host's).
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::Tensor;
//! use drove_kernels::backends::{Kernels, OnKernels, Same, dispatch};
//!
//! /// Doubles a tensor with drove's kernels where they exist.
//! struct Double<B: burn::tensor::backend::Backend>(Tensor<B, 1>);
//!
//! impl<B: burn::tensor::backend::Backend> OnKernels<B> for Double<B> {
//!     type Output = Tensor<B, 1>;
//!     fn run<K: Kernels>(self, same: Same<B, K>) -> Tensor<B, 1> {
//!         let x: Tensor<K, 1> = same.to(self.0);
//!         same.back(x.clone() + x)
//!     }
//! }
//!
//! let x = Tensor::<Flex, 1>::ones([3], &Default::default());
//! // No kernels for the CPU backend: the call comes back unrun.
//! assert!(dispatch(Double(x)).is_err());
//! ```

use std::any::{Any, TypeId};
use std::marker::PhantomData;

use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Tensor, TensorKind};

use crate::dropout::DropoutBackend;
use crate::embedding::EmbeddingBackend;
use crate::pack::PackBackend;

/// The cubecl backend over CUDA that [`Cuda`] fuses over: f32 floats, i32
/// ints, u8 bools.
#[cfg(feature = "cuda")]
pub type CudaCube = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// burn's CUDA backend under fusion, drove's CUDA training backend
/// (drove-device's `cuda::Cuda`).
#[cfg(feature = "cuda")]
pub type Cuda = burn_fusion::Fusion<CudaCube>;

/// burn's wgpu backend without fusion: f32 floats, i32 ints, u32 bools,
/// drove's wgpu training backend (drove-device's `wgpu::Wgpu`).
#[cfg(feature = "wgpu")]
pub type Wgpu = burn_cubecl::CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

/// [`Wgpu`] under burn's fusion: the CUDA build's fused path, on any wgpu
/// adapter (lavapipe in the tests).
#[cfg(feature = "wgpu")]
pub type WgpuFused = burn_fusion::Fusion<Wgpu>;

/// burn's wgpu device (`WgpuDevice::DefaultDevice` and the others).
#[cfg(feature = "wgpu")]
pub use cubecl::wgpu::WgpuDevice;

/// burn's default wgpu device when wgpu finds an adapter (Vulkan, Metal,
/// DX12; Mesa's lavapipe on a machine without a GPU), `None` otherwise:
/// cubecl panics when it opens a device without one.
#[cfg(feature = "wgpu")]
pub fn wgpu_default_device() -> Option<WgpuDevice> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let adapters = cubecl::future::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    (!adapters.is_empty()).then_some(WgpuDevice::DefaultDevice)
}

/// A backend drove has its own kernels for: every kernel family of this
/// crate, as burn backend operations (each family is a supertrait here).
pub trait Kernels:
    Backend + DropoutBackend + EmbeddingBackend + PackBackend + crate::matmul::MatmulOps
{
}

impl<B: Backend + DropoutBackend + EmbeddingBackend + PackBackend + crate::matmul::MatmulOps> Kernels for B {}

/// Proof that `A` and `B` are one type (made only by [`dispatch`] after
/// comparing their `TypeId`s): moves tensors between the two names.
pub struct Same<A, B>(PhantomData<fn(A) -> B>);

impl<A: Backend, B: Backend> Same<A, B> {
    /// `tensor` under the name `B`.
    pub fn to<const D: usize, K>(&self, tensor: Tensor<A, D, K>) -> Tensor<B, D, K>
    where
        K: TensorKind<A> + TensorKind<B> + BasicOps<A> + BasicOps<B> + 'static,
    {
        retype(tensor)
    }

    /// `tensor` back under the name `A`.
    pub fn back<const D: usize, K>(&self, tensor: Tensor<B, D, K>) -> Tensor<A, D, K>
    where
        K: TensorKind<A> + TensorKind<B> + BasicOps<A> + BasicOps<B> + 'static,
    {
        retype(tensor)
    }
}

/// Moves a value to a type that [`Same`] proved to be its own.
fn retype<T: Any, U: Any>(value: T) -> U {
    match (Box::new(value) as Box<dyn Any>).downcast::<U>() {
        Ok(value) => *value,
        Err(_) => unreachable!("`Same` is made only for one type under two names"),
    }
}

/// A call of drove's kernels from code generic over its backend `B`.
pub trait OnKernels<B: Backend>: Sized {
    /// What the call gives.
    type Output;

    /// Runs the call on `K`, which is `B` under its concrete name (`same`
    /// moves tensors between the two).
    fn run<K: Kernels>(self, same: Same<B, K>) -> Self::Output;
}

/// Whether `B` is one of the backends drove has kernels for (in this build).
pub fn has_kernels<B: Backend>() -> bool {
    struct Probe;
    impl<B: Backend> OnKernels<B> for Probe {
        type Output = ();
        fn run<K: Kernels>(self, _: Same<B, K>) {}
    }
    dispatch::<B, _>(Probe).is_ok()
}

/// Runs `call` on drove's kernels when `B` is one of the backends listed in
/// this module (or `Autodiff` over one); otherwise gives `call` back, unrun.
pub fn dispatch<B: Backend, C: OnKernels<B>>(call: C) -> Result<C::Output, C> {
    macro_rules! on {
        ($call:ident, $($k:ty),* $(,)?) => {
            $(
                let $call = match attempt::<B, $k, C>($call) {
                    Ok(output) => return Ok(output),
                    Err(call) => call,
                };
            )*
        };
    }
    #[cfg(feature = "cuda")]
    on!(call, Cuda, burn::backend::Autodiff<Cuda>, CudaCube, burn::backend::Autodiff<CudaCube>);
    #[cfg(feature = "wgpu")]
    on!(call, Wgpu, burn::backend::Autodiff<Wgpu>, WgpuFused, burn::backend::Autodiff<WgpuFused>);
    Err(call)
}

/// Runs `call` as `K` when `B` is `K`.
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
fn attempt<B: Backend, K: Kernels, C: OnKernels<B>>(call: C) -> Result<C::Output, C> {
    if TypeId::of::<B>() == TypeId::of::<K>() { Ok(call.run(Same::<B, K>(PhantomData))) } else { Err(call) }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};

    use super::*;

    #[test]
    fn the_cpu_backend_has_no_kernels() {
        assert!(!has_kernels::<Flex>());
        assert!(!has_kernels::<Autodiff<Flex>>());
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn the_wgpu_backends_have_kernels() {
        assert!(has_kernels::<Wgpu>());
        assert!(has_kernels::<Autodiff<Wgpu>>());
        assert!(has_kernels::<WgpuFused>());
        assert!(has_kernels::<Autodiff<WgpuFused>>());
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn the_cuda_backends_have_kernels() {
        assert!(has_kernels::<Cuda>());
        assert!(has_kernels::<Autodiff<Cuda>>());
    }
}

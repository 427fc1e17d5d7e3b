//! The embedding lookup whose table gradient is drove's deterministic
//! scatter instead of burn's `select_assign` (issue 49, step 5).
//!
//! burn's embedding backward adds every token's gradient row into a zeroed
//! table with `select_assign`, which burn-cubecl runs as one thread a
//! column, each walking every token of the batch: 384 threads for MiniLM,
//! whatever the batch. Here the batch's ids are sorted on the device and
//! each (distinct id, column) is one thread that sums its tokens' rows in
//! ascending token order: no atomics, the same bits on every run, and the
//! same order of additions as burn's (zero, then the tokens in order).
//!
//! [`lookup`] is the entry for code generic over its backend: on the
//! backends of [`crate::backends`] (and `Autodiff` over each) it runs
//! [`EmbeddingBackend::lookup`]; on others (the CPU) it hands the table and
//! the ids back, for burn's `embedding`. As burn operations, by backend:
//! on burn-cubecl's, the lookup is burn's and the gradient three launches
//! (zeros, the sort, the sums; `kernel.rs`); under fusion the gradient is a
//! custom operation of the stream; under autodiff the lookup is a node whose
//! backward is that gradient.

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod autodiff;
mod backend;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod fusion;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod kernel;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorPrimitive};

pub use backend::EmbeddingBackend;

use crate::backends::{Kernels, OnKernels, Same, dispatch};

/// The rows of `weight` `[vocab, hidden]` at `ids` `[batch, seq]`, as
/// `[batch, seq, hidden]`: burn's `embedding`, with the table's gradient
/// (under autodiff) summed by drove's deterministic scatter, when `B` is one
/// of drove's GPU backends. Otherwise `Err((weight, ids))`, unchanged, for
/// burn's lookup; so too when the ids or the gradient have more than
/// `u32::MAX` elements (the kernels' 32-bit places).
#[allow(clippy::type_complexity)]
pub fn lookup<B: Backend>(
    weight: Tensor<B, 2>,
    ids: Tensor<B, 2, Int>,
) -> Result<Tensor<B, 3>, (Tensor<B, 2>, Tensor<B, 2, Int>)> {
    struct EmbeddingCall<B: Backend>(Tensor<B, 2>, Tensor<B, 2, Int>);

    impl<B: Backend> OnKernels<B> for EmbeddingCall<B> {
        type Output = Tensor<B, 3>;

        fn run<K: Kernels>(self, same: Same<B, K>) -> Tensor<B, 3> {
            let (weight, ids): (Tensor<K, 2>, Tensor<K, 2, Int>) = (same.to(self.0), same.to(self.1));
            let rows = K::lookup(weight.into_primitive().tensor(), ids.into_primitive());
            same.back(Tensor::from_primitive(TensorPrimitive::Float(rows)))
        }
    }

    let [vocab, hidden] = weight.dims();
    let tokens = ids.shape().num_elements();
    if [tokens, tokens.saturating_mul(hidden), vocab.saturating_mul(hidden)]
        .iter()
        .any(|&n| n > u32::MAX as usize)
    {
        return Err((weight, ids));
    }
    dispatch(EmbeddingCall(weight, ids)).map_err(|call| (call.0, call.1))
}

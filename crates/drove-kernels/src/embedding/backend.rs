//! [`EmbeddingBackend`], the operation each of drove's GPU backends
//! implements (`cube.rs`, `fusion.rs`, `autodiff.rs`); [`super::lookup`]
//! calls it.

use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};

/// A backend that computes an embedding table's gradient itself, with a
/// deterministic scatter (no atomics: each row of the table summed by one
/// thread a column, its tokens in ascending order).
pub trait EmbeddingBackend: Backend {
    /// The rows of `weight` `[vocab, hidden]` at `ids` `[batch, seq]`:
    /// `[batch, seq, hidden]`, burn's `embedding` (a `select`). Under
    /// autodiff, the weight's gradient is [`EmbeddingBackend::lookup_weight_grad`].
    fn lookup(weight: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        Self::embedding(weight, ids)
    }

    /// The gradient of [`EmbeddingBackend::lookup`] for its table of `vocab`
    /// rows: `[vocab, hidden]`, row `v` the sum of `grad`'s rows (`grad` is
    /// `[batch, seq, hidden]`) at the tokens whose id is `v`, added in
    /// ascending token order from 0.0; rows no token has are 0.
    fn lookup_weight_grad(grad: FloatTensor<Self>, ids: IntTensor<Self>, vocab: usize) -> FloatTensor<Self>;
}

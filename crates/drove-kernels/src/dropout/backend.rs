//! [`DropoutBackend`], the operation each of drove's GPU backends implements
//! (`cube.rs`, `fusion.rs`, `autodiff.rs`); [`super::masked`] calls it.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::Mask;

/// A backend that computes dropout with a [`Mask`] itself.
pub trait DropoutBackend: Backend {
    /// `x` times `mask`'s values, `x`'s first dimension being the batch row.
    fn masked(x: FloatTensor<Self>, mask: Mask) -> FloatTensor<Self>;
}

//! [`MatmulOps`], the operation each of drove's GPU backends implements
//! (`cube.rs`, `fused.rs`, `autodiff.rs`); [`super::matmul`] calls it.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::Precision;

/// drove's matmul as an operation of a backend: `lhs x rhs` over the last two
/// dimensions, the leading ones broadcast, with the kernel [`super::choose`]
/// picks for the shape at `precision`.
pub trait MatmulOps: Backend {
    /// The product of two float tensors of one rank (2 or more) whose shapes
    /// burn's `matmul` accepts.
    fn drove_matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        precision: Precision,
    ) -> FloatTensor<Self>;
}

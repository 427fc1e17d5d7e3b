//! [`PackBackend`], the operation each of drove's GPU backends implements
//! (`cube.rs`, `fusion.rs`, `autodiff.rs`); [`super::concat`] calls it.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

/// A backend that packs float tensors end to end into one buffer in a
/// launch for each [`super::MAX_GROUP`] of them, where burn's `cat` launches
/// a copy for each.
pub trait PackBackend: Backend {
    /// `parts`, each read as its elements in row-major order, end to end in
    /// one 1-D tensor of their total length: burn's `cat` along dimension 0
    /// of the parts flattened, the same values bit for bit. The parts share
    /// a dtype; there is at least one.
    fn pack(parts: Vec<FloatTensor<Self>>) -> FloatTensor<Self>;
}

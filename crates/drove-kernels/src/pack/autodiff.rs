//! [`PackBackend`] under burn's autodiff: the inner backend's pack, as a
//! constant. drove packs gradients, which no backward pass reads, so the
//! result is not tracked (a backward would be the output split into the
//! parts' shapes).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::FloatTensor;

use super::PackBackend;

impl<B: PackBackend, C: CheckpointStrategy> PackBackend for Autodiff<B, C> {
    fn pack(parts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        Self::from_inner(B::pack(parts.into_iter().map(Self::inner).collect()))
    }
}

//! [`EmbeddingBackend`] under burn's autodiff: the lookup as a node whose
//! backward is the inner backend's [`EmbeddingBackend::lookup_weight_grad`]
//! (burn's own node computes `embedding_backward`, a `select_assign`). The
//! node keeps the ids and the table's row count, not the table, which burn's
//! keeps only for its shape.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::TensorMetadata;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::ops::{FloatTensor, IntTensor};

use super::EmbeddingBackend;

/// The backward step of one lookup.
#[derive(Debug)]
struct LookupBackward;

impl<B: EmbeddingBackend> Backward<B, 1> for LookupBackward {
    /// The ids and the table's row count.
    type State = (IntTensor<B>, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (ids, vocab) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| B::lookup_weight_grad(grad, ids, vocab));
    }
}

impl<B: EmbeddingBackend, C: CheckpointStrategy> EmbeddingBackend for Autodiff<B, C> {
    fn lookup(weight: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        let vocab = weight.primitive.shape()[0];
        match LookupBackward.prepare::<C>([weight.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((ids.clone(), vocab), B::lookup(weight.primitive, ids)),
            OpsKind::UnTracked(prep) => prep.finish(B::lookup(weight.primitive, ids)),
        }
    }

    /// The inner backend's gradient, not tracked itself.
    fn lookup_weight_grad(grad: FloatTensor<Self>, ids: IntTensor<Self>, vocab: usize) -> FloatTensor<Self> {
        Self::from_inner(B::lookup_weight_grad(Self::inner(grad), ids, vocab))
    }
}

//! [`DropoutBackend`] under burn's autodiff: a backward step that applies
//! the same mask to the incoming gradient, recomputed from its key, so no
//! mask is kept alive between forward and backward.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::tensor::ops::FloatTensor;

use super::{DropoutBackend, Mask};

/// The backward step: the gradient times the mask (its key is the state).
#[derive(Debug)]
struct MaskedBackward;

impl<B: DropoutBackend> Backward<B, 1> for MaskedBackward {
    type State = Mask;

    fn backward(self, ops: Ops<Mask, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let mask = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| B::masked(grad, mask));
    }
}

impl<B: DropoutBackend, C: CheckpointStrategy> DropoutBackend for Autodiff<B, C> {
    fn masked(x: FloatTensor<Self>, mask: Mask) -> FloatTensor<Self> {
        let output = B::masked(x.primitive.clone(), mask);
        match MaskedBackward.prepare::<C>([x.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(mask, output),
            OpsKind::UnTracked(prep) => prep.finish(output),
        }
    }
}

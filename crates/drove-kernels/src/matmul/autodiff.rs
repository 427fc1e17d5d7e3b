//! drove's matmul on `Autodiff<B>`: a node whose backward is two products
//! through `B`'s same operation at the same precision, `grad x rhs^T` and
//! `lhs^T x grad`, each summed over the batch dimensions its operand was
//! broadcast along, as burn-autodiff-0.21.0's own matmul backward
//! (`src/ops/tensor.rs:565-621`).

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, binary, broadcast_shape};
use burn::tensor::Shape;
use burn::tensor::ops::FloatTensor;

use super::{MatmulOps, Precision};

/// The backward step of one product.
#[derive(Debug)]
struct MatmulBackward;

/// What backward needs: each operand where the other's gradient needs it,
/// both operands' shapes, and the precision.
#[derive(Clone, Debug)]
struct Saved<B: MatmulOps> {
    lhs: Option<FloatTensor<B>>,
    rhs: Option<FloatTensor<B>>,
    lhs_shape: Shape,
    rhs_shape: Shape,
    precision: Precision,
}

impl<B: MatmulOps> Backward<B, 2> for MatmulBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let Saved { lhs, rhs, lhs_shape, rhs_shape, precision } = ops.state;
        binary::<B, _, _>(
            ops.parents,
            ops.node,
            grads,
            |grad| {
                let rhs = rhs.expect("the right operand, kept because the left one is tracked");
                broadcast_shape::<B>(B::drove_matmul(grad, B::float_transpose(rhs), precision), &lhs_shape)
            },
            |grad| {
                let lhs = lhs.expect("the left operand, kept because the right one is tracked");
                broadcast_shape::<B>(B::drove_matmul(B::float_transpose(lhs), grad, precision), &rhs_shape)
            },
        );
    }
}

impl<B: MatmulOps, C: CheckpointStrategy> MatmulOps for Autodiff<B, C> {
    fn drove_matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        precision: Precision,
    ) -> FloatTensor<Self> {
        use burn::tensor::TensorMetadata as _;
        let (lhs_tracked, rhs_tracked) = (lhs.is_tracked(), rhs.is_tracked());
        let product = B::drove_matmul(lhs.primitive.clone(), rhs.primitive.clone(), precision);
        match MatmulBackward.prepare::<C>([lhs.node.clone(), rhs.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let saved = Saved {
                    lhs_shape: lhs.primitive.shape(),
                    rhs_shape: rhs.primitive.shape(),
                    lhs: rhs_tracked.then(|| lhs.primitive.clone()),
                    rhs: lhs_tracked.then(|| rhs.primitive.clone()),
                    precision,
                };
                prep.finish(saved, product)
            }
            OpsKind::UnTracked(prep) => prep.finish(product),
        }
    }
}

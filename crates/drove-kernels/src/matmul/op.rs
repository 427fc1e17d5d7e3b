//! [`matmul`], drove's matrix product for code generic over its backend
//! (the operation itself is [`super::MatmulOps`]).

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::Precision;
use crate::backends::{Kernels, OnKernels, Same, dispatch};

/// `lhs.matmul(rhs)` through drove's operation where the backend has it
/// ([`crate::backends`]), burn's `matmul` elsewhere (the CPU). Tensors of
/// rank 2 to 4 as in a BERT step: dense layers `[b, s, in] x [1, in, out]`,
/// attention `[b, h, l, d] x [b, h, d, l]`. Shapes burn's `matmul` refuses
/// go to it, for its message.
pub fn matmul<B: Backend, const D: usize>(
    lhs: Tensor<B, D>,
    rhs: Tensor<B, D>,
    precision: Precision,
) -> Tensor<B, D> {
    if !fits(&lhs.dims(), &rhs.dims()) {
        return lhs.matmul(rhs);
    }
    match dispatch(MatmulCall { lhs, rhs, precision }) {
        Ok(product) => product,
        Err(MatmulCall { lhs, rhs, .. }) => lhs.matmul(rhs),
    }
}

/// Whether burn's `matmul` accepts these shapes: equal inner dimensions and
/// batch dimensions equal or 1.
fn fits(lhs: &[usize], rhs: &[usize]) -> bool {
    let d = lhs.len();
    d >= 2
        && lhs[d - 1] == rhs[d - 2]
        && lhs[..d - 2].iter().zip(&rhs[..d - 2]).all(|(&a, &b)| a == b || a == 1 || b == 1)
}

/// One call of [`matmul`], handed to [`dispatch`].
struct MatmulCall<B: Backend, const D: usize> {
    lhs: Tensor<B, D>,
    rhs: Tensor<B, D>,
    precision: Precision,
}

impl<B: Backend, const D: usize> OnKernels<B> for MatmulCall<B, D> {
    type Output = Tensor<B, D>;
    fn run<K: Kernels>(self, same: Same<B, K>) -> Tensor<B, D> {
        let lhs = same.to(self.lhs).into_primitive().tensor();
        let rhs = same.to(self.rhs).into_primitive().tensor();
        let product = K::drove_matmul(lhs, rhs, self.precision);
        same.back(Tensor::<K, D>::from_primitive(TensorPrimitive::Float(product)))
    }
}

/// Which matmul a training step's model layers use (the flags
/// `--matmul burn|drove` and `--matmul-precision tf32|f32`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Matmul {
    /// burn's own `matmul` (on GPUs: one TF32 tensor-core kernel for every shape).
    #[default]
    Burn,
    /// drove's operation at this precision.
    Drove(Precision),
}

impl Matmul {
    /// `lhs.matmul(rhs)` the chosen way.
    pub fn apply<B: Backend, const D: usize>(self, lhs: Tensor<B, D>, rhs: Tensor<B, D>) -> Tensor<B, D> {
        match self {
            Matmul::Burn => lhs.matmul(rhs),
            Matmul::Drove(precision) => matmul(lhs, rhs, precision),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::tensor::Distribution;

    use super::*;

    #[test]
    fn shapes_burn_accepts_fit_and_others_do_not() {
        assert!(fits(&[4, 3], &[3, 5]));
        assert!(fits(&[2, 7, 4, 3], &[2, 1, 3, 5]));
        assert!(fits(&[1, 4, 3], &[6, 3, 5]));
        assert!(!fits(&[4, 3], &[4, 5]));
        assert!(!fits(&[2, 4, 3], &[3, 3, 5]));
    }

    #[test]
    fn on_the_cpu_it_is_burns_matmul_with_its_gradients() {
        let device = Default::default();
        let a = Tensor::<Autodiff<Flex>, 3>::random([2, 4, 3], Distribution::Default, &device).require_grad();
        let b = Tensor::<Autodiff<Flex>, 3>::random([1, 3, 5], Distribution::Default, &device).require_grad();
        for how in [Matmul::Burn, Matmul::Drove(Precision::F32), Matmul::Drove(Precision::Tf32)] {
            let ours = how.apply(a.clone(), b.clone());
            let grads = ours.clone().sum().backward();
            let theirs = a.clone().matmul(b.clone());
            let their_grads = theirs.clone().sum().backward();
            ours.into_data().assert_eq(&theirs.into_data(), true);
            a.grad(&grads).unwrap().into_data().assert_eq(&a.grad(&their_grads).unwrap().into_data(), true);
            b.grad(&grads).unwrap().into_data().assert_eq(&b.grad(&their_grads).unwrap().into_data(), true);
        }
    }
}

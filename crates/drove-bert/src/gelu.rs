//! The exact GELU, `x * Phi(x)`, with a vectorised `erf` on the CPU backend.
//!
//! burn's CPU backend (`Flex`) computes GELU and its gradient one element at a
//! time through `libm`'s `erff`, which made them a tenth of a MiniLM training
//! step. [`gelu`] runs a rational-polynomial `erf` (Eigen's, within a few ulps
//! of `erff`) and a Cephes-style `exp` in plain loops that the compiler
//! vectorises, with AVX2/FMA when the CPU has them, for `Flex` and
//! `Autodiff<Flex>`; every other backend gets burn's own GELU. The model stays
//! generic: the choice is a type check at run time, not a trait bound.

use std::any::Any;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive, activation};

/// The exact GELU of `x` (as `burn::tensor::activation::gelu`), fast on the CPU
/// backend.
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let x: Box<dyn Any> = Box::new(x);
    let x = match x.downcast::<Tensor<Autodiff<Flex>, D>>() {
        Ok(t) => return cast(tracked(*t)),
        Err(other) => other,
    };
    let x = match x.downcast::<Tensor<Flex, D>>() {
        Ok(t) => return cast(host(*t, |_, piece| gelu_slice(piece))),
        Err(other) => other,
    };
    activation::gelu(*x.downcast::<Tensor<B, D>>().expect("the tensor's own type"))
}

/// Moves a tensor of a concrete backend back into the caller's generic type
/// (the same type, checked at run time).
fn cast<T: Any, U: Any>(t: T) -> U {
    *(Box::new(t) as Box<dyn Any>).downcast::<U>().expect("the same tensor type")
}

/// Elements per piece of work handed to rayon's threads.
const PIECE: usize = 1 << 15;

/// The values of a CPU tensor, row-major.
fn values<const D: usize>(x: Tensor<Flex, D>) -> Vec<f32> {
    x.into_data().convert::<f32>().into_vec::<f32>().expect("f32 values")
}

/// Applies `f(offset, piece)` to the values of a CPU tensor in place, in
/// pieces on rayon's threads.
fn host<const D: usize>(x: Tensor<Flex, D>, f: impl Fn(usize, &mut [f32]) + Sync + Send) -> Tensor<Flex, D> {
    use rayon::prelude::*;
    let (device, shape) = (x.device(), x.shape());
    let mut values = values(x);
    values.par_chunks_mut(PIECE).enumerate().for_each(|(i, piece)| f(i * PIECE, piece));
    Tensor::from_data(TensorData::new(values, shape), &device)
}

/// GELU on `Autodiff<Flex>`, recording its own backward step.
fn tracked<const D: usize>(x: Tensor<Autodiff<Flex>, D>) -> Tensor<Autodiff<Flex>, D> {
    #[derive(Debug)]
    struct GeluBackward<const D: usize>;

    impl<const D: usize> Backward<Flex, 1> for GeluBackward<D> {
        // The input, to evaluate the derivative at.
        type State = burn::tensor::ops::FloatTensor<Flex>;

        fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
            let input = ops.state;
            unary::<Flex, _>(ops.parents, ops.node, grads, |grad| {
                let xs = values(Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(input)));
                let g = Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(grad));
                host(g, |at, piece| gelu_grad_slice(&xs[at..at + piece.len()], piece))
                    .into_primitive()
                    .tensor()
            });
        }
    }

    let input = x.into_primitive().tensor();
    let inner = Tensor::<Flex, D>::from_primitive(TensorPrimitive::Float(input.primitive.clone()));
    let output = host(inner, |_, piece| gelu_slice(piece)).into_primitive().tensor();
    let result =
        match GeluBackward::<D>.prepare::<NoCheckpointing>([input.node.clone()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(input.primitive.clone(), output),
            OpsKind::UnTracked(prep) => prep.finish(output),
        };
    Tensor::from_primitive(TensorPrimitive::Float(result))
}

/// `erf`, Eigen's rational approximation on [-4, 4] (beyond, +-1 in f32).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2.mul_add(-2.726_142_3e-10, 2.770_681_4e-8);
    p = x2.mul_add(p, -2.101_024e-6);
    p = x2.mul_add(p, -5.692_506_4e-5);
    p = x2.mul_add(p, -7.349_906e-4);
    p = x2.mul_add(p, -2.954_600_1e-3);
    p = x2.mul_add(p, -1.609_603_3e-2);
    let mut q = x2.mul_add(-1.456_607_2e-5, -2.133_740_6e-4);
    q = x2.mul_add(q, -1.682_827e-3);
    q = x2.mul_add(q, -7.373_329e-3);
    q = x2.mul_add(q, -1.426_474e-2);
    x * p / q
}

/// `exp`, Cephes' `expf`: a power of two times a degree-6 polynomial.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    let x = x.clamp(-87.0, 88.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = n.mul_add(-0.693_359_4, x);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut y = r.mul_add(1.987_569_1e-4, 1.398_199_9e-3);
    y = r.mul_add(y, 8.333_452e-3);
    y = r.mul_add(y, 4.166_579_6e-2);
    y = r.mul_add(y, 1.666_666_5e-1);
    y = r.mul_add(y, 0.5); // Cephes' 5.0000001201e-1, as f32
    let y = (r * r).mul_add(y, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[inline(always)]
fn gelu_one(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
fn gelu_grad_one(x: f32, g: f32) -> f32 {
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let cdf = 0.5 * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
    let pdf = INV_SQRT_2PI * exp(-0.5 * x * x);
    g * x.mul_add(pdf, cdf)
}

macro_rules! multiversion {
    ($name:ident, $body:expr, ($($arg:ident : $ty:ty),*)) => {
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn wide($($arg: $ty),*) {
                    $body
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU has the features `wide` was compiled for.
                    return unsafe { wide($($arg),*) };
                }
            }
            $body
        }
    };
}

multiversion!(
    gelu_slice,
    for v in values.iter_mut() {
        *v = gelu_one(*v);
    },
    (values: &mut [f32])
);

multiversion!(
    gelu_grad_slice,
    for (g, &x) in grads.iter_mut().zip(inputs) {
        *g = gelu_grad_one(x, *g);
    },
    (inputs: &[f32], grads: &mut [f32])
);

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> impl Iterator<Item = f32> {
        (-60_000..=60_000).map(|i| i as f32 * 1e-4)
    }

    #[test]
    fn erf_is_within_a_few_ulps_of_libm() {
        let worst = grid().map(|x| (erf(x) - libm::erff(x)).abs()).fold(0f32, f32::max);
        assert!(worst < 5e-7, "max |erf - erff| = {worst:e}");
        assert_eq!(erf(0.0), 0.0);
        // Saturates at erf(4) = 1 - 1.5e-8, within an ulp of 1.
        assert!((erf(10.0) - 1.0).abs() <= f32::EPSILON && (erf(-10.0) + 1.0).abs() <= f32::EPSILON);
    }

    #[test]
    fn exp_is_within_a_few_ulps_of_std() {
        let (worst, at) = (-86_900..=80_000)
            .map(|i| i as f32 * 1e-3)
            .map(|x| (((exp(x) - x.exp()) / x.exp()).abs(), x))
            .fold((0f32, 0f32), |a, b| if b.0 > a.0 { b } else { a });
        eprintln!("exp: worst relative error {worst:e} at {at}");
        assert!(worst < 5e-7, "max relative |exp - std exp| = {worst:e}");
    }

    /// Largest difference, relative to the larger of 1 and the value.
    fn worst(a: Vec<f32>, b: Vec<f32>) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(&b).map(|(x, y)| (x - y).abs() / y.abs().max(1.0)).fold(0f32, f32::max)
    }

    #[test]
    fn gelu_and_its_gradient_match_burn_on_flex() {
        let device = Default::default();
        // Every input from -12 to 12 in steps of 0.01; weights that vary in sign.
        let xs: Vec<f32> = (-1200..1200).map(|i| i as f32 * 0.01).collect();
        let ws: Vec<f32> = (0..xs.len()).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::<Autodiff<Flex>, 2>::from_data(TensorData::new(xs.clone(), [8, 300]), &device)
            .require_grad();
        let w = Tensor::<Autodiff<Flex>, 2>::from_data(TensorData::new(ws, [8, 300]), &device);
        let (ours, theirs) = (gelu(x.clone()), activation::gelu(x.clone()));
        let values = |t: Tensor<Autodiff<Flex>, 2>| t.into_data().to_vec::<f32>().unwrap();
        let forward = worst(values(ours.clone()), values(theirs.clone()));
        assert!(forward < 1e-6, "forward differs by {forward:e}");
        let (g_ours, g_theirs) = ((ours * w.clone()).sum().backward(), (theirs * w).sum().backward());
        let grad = |g| x.grad(&g).unwrap().into_data().to_vec::<f32>().unwrap();
        let backward = worst(grad(g_ours), grad(g_theirs));
        assert!(backward < 1e-6, "gradient differs by {backward:e}");
        // Without autodiff too.
        let plain = Tensor::<Flex, 1>::from_data(TensorData::new(xs, [2400]), &device);
        let values = |t: Tensor<Flex, 1>| t.into_data().to_vec::<f32>().unwrap();
        let inference = worst(values(gelu(plain.clone())), values(activation::gelu(plain)));
        assert!(inference < 1e-6, "inference differs by {inference:e}");
    }
}

//! drove's matmul on `CubeBackend<R>`: cubek-matmul's `launch_ref` with a
//! chosen strategy, as burn-cubecl's own `launch_matmul` calls it with the
//! default one (`burn-cubecl-0.21.0/src/kernel/matmul/base.rs:84-161`, here
//! without its quantized inputs, which drove does not train).

use burn::tensor::ops::FloatTensor;
use burn_cubecl::kernel::matmul::init_matmul_output;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulSetupError};
use cubek::matmul::launch::Strategy;
use cubek::std::InputBinding;

use super::{Gemm, Kernel, MatmulOps, Precision, choose};

/// A kernel cubek could not launch for a product.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cubek's {kernel} cannot multiply {lhs:?} by {rhs:?} on this device: {reason}")]
pub struct MatmulLaunchError {
    /// The kernel asked for.
    pub kernel: Kernel,
    /// The left operand's shape.
    pub lhs: Vec<usize>,
    /// The right operand's shape.
    pub rhs: Vec<usize>,
    /// cubek's reason.
    pub reason: String,
    /// Whether the device lacks what the kernel needs (tensor cores, TMA,
    /// types), rather than the problem being one it refuses.
    pub unavailable: bool,
}

/// The GEMM `lhs x rhs` is, from the two shapes (batch dimensions broadcast).
pub fn gemm_of(lhs: &[usize], rhs: &[usize]) -> Gemm {
    let d = lhs.len();
    let batch = lhs[..d - 2].iter().zip(&rhs[..d - 2]).map(|(&a, &b)| a.max(b)).product();
    Gemm { m: lhs[d - 2], n: rhs[d - 1], k: lhs[d - 1], batch }
}

/// `lhs x rhs` by `kernel`, or why cubek could not launch it. The product
/// is queued, not waited for.
pub fn launch<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    kernel: Kernel,
) -> Result<CubeTensor<R>, MatmulLaunchError> {
    launch_strategy(lhs, rhs, &kernel.cubek()).map_err(|(lhs, rhs, e)| MatmulLaunchError {
        kernel,
        lhs,
        rhs,
        unavailable: matches!(e, MatmulSetupError::Unavailable(_)),
        reason: e.to_string(),
    })
}

type Failed = (Vec<usize>, Vec<usize>, MatmulSetupError);

fn launch_strategy<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    strategy: &Strategy,
) -> Result<CubeTensor<R>, Failed> {
    let (lhs_shape, rhs_shape) = (lhs.meta.shape().to_vec(), rhs.meta.shape().to_vec());
    let out = init_matmul_output(&lhs, &rhs, lhs.dtype);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: lhs.dtype.into(),
        rhs: rhs.dtype.into(),
        out: out.dtype.into(),
    });
    let client = out.client.clone();
    let (lhs_dtype, rhs_dtype) = (lhs.dtype, rhs.dtype);
    cubek::matmul::launch::launch_ref(
        strategy,
        &client,
        InputBinding::new(lhs.binding(), lhs_dtype.into()),
        InputBinding::new(rhs.binding(), rhs_dtype.into()),
        out.clone().binding(),
        &mut dtypes,
    )
    .map_err(|e| (lhs_shape, rhs_shape, e))?;
    Ok(out)
}

/// `lhs x rhs` by the kernel the table chooses at `precision`; where the
/// device cannot run it, cubek's unit kernel (f32, no tensor cores: what
/// cubek's `Auto` falls back to); where neither launches, burn's own matmul.
pub fn multiply<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    precision: Precision,
) -> CubeTensor<R> {
    let chosen = choose(gemm_of(lhs.meta.shape(), rhs.meta.shape()), precision);
    let tries = [chosen, Kernel::FALLBACK];
    let tries = if chosen == Kernel::FALLBACK { &tries[..1] } else { &tries[..] };
    for &kernel in tries {
        if let Ok(out) = launch(lhs.clone(), rhs.clone(), kernel) {
            return out;
        }
    }
    burn_cubecl::kernel::matmul::matmul(lhs.clone(), rhs, None, Default::default(), lhs.dtype)
        .unwrap_or_else(|e| panic!("no matmul kernel launches for {:?} here: {e}", lhs.meta.shape()))
}

impl<R, F, I, BT> MatmulOps for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn drove_matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        precision: Precision,
    ) -> FloatTensor<Self> {
        multiply(lhs, rhs, precision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_of_broadcasts_the_batch() {
        assert_eq!(gemm_of(&[4, 3], &[3, 5]), Gemm { m: 4, n: 5, k: 3, batch: 1 });
        assert_eq!(gemm_of(&[2, 6, 4, 3], &[2, 6, 3, 5]), Gemm { m: 4, n: 5, k: 3, batch: 12 });
        assert_eq!(gemm_of(&[8, 4, 3], &[1, 3, 5]), Gemm { m: 4, n: 5, k: 3, batch: 8 });
    }
}

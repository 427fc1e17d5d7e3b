//! Which cubek kernel multiplies a GEMM of a given shape at a given
//! precision: [`choose`], a pure function of `(m, n, k, batch, precision)`
//! through the [`ShapeClass`] of the shape, so the table is unit-tested
//! without a device and set from a GPU sweep (`drove bench matmul`).
//!
//! # Precision
//!
//! burn 0.21 always takes cubek-matmul 0.2's default, `SimpleCyclicCmma`
//! (`burn-cubecl-0.21.0/src/kernel/matmul/base.rs:47` and cubek's
//! `launch/strategy.rs:549-573`), and cubek stages f32 operands as TF32
//! (10-bit mantissa) whenever the device has TF32 tensor cores: every
//! tensor-core routine (`Cmma` and `Mma` tile matmuls) calls
//! `adjust_dtypes(.., tile_matmul.requires_accelerator())`
//! (`cubek-matmul-0.2.0/src/routines/selector/plane.rs:50`,
//! `routines/simple.rs:203`, `routines/specialized.rs:180`), which rewrites
//! the stage and register types of f32 operands to `tf32` when
//! `client.properties().supports_type(tf32)` (`definition/blueprint.rs:84-113`;
//! `requires_accelerator` is true for `Cmma` and `Mma` only,
//! `components/tile.rs:104-111`). CUDA's TF32 CMMA is emitted as
//! `wmma.mma.sync...m16n16k8.f32.tf32.tf32.f32`
//! (`cubecl-cpp-0.10.0/src/cuda/mma/ptx_wmma_compiler.rs:191-192`).
//!
//! The unit routines (`SimpleUnit`, `DoubleUnit`) use the `Register` tile
//! matmul (`routines/simple_unit.rs:88`, `routines/double_unit.rs:67`) and
//! never call `adjust_dtypes`: their types come from
//! `MatmulElems::from_globals` (`definition/spec.rs:276-296`: stage and
//! register types equal to the f32 globals, accumulator f32), reset to the
//! globals by `adjust_stage_dtypes` (`spec.rs:348-352`), and the inner
//! product is `acc += A::cast_from(lhs) * A::cast_from(rhs)` in f32
//! (`cubek-std-0.2.0/src/tile/compute/matmul/register.rs:45-47, 66-70`).
//! So at [`Precision::F32`] the table holds unit kernels only: f32 in the
//! inner product on every device, as PyTorch with `allow_tf32 = False`.

use std::fmt;
use std::str::FromStr;

#[cfg(any(feature = "cuda", feature = "wgpu"))]
use cubek::matmul::launch::Strategy;

/// The arithmetic of a matmul's inner products on a GPU (PyTorch's
/// `torch.backends.cuda.matmul.allow_tf32`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 operands may be rounded to TF32 (10-bit mantissa) for tensor
    /// cores, where the device has them (cubek's default, burn's only way).
    #[default]
    Tf32,
    /// f32 all the way: kernels without tensor cores.
    F32,
}

impl Precision {
    /// Both, TF32 first.
    pub const ALL: [Precision; 2] = [Precision::Tf32, Precision::F32];

    /// The flag's spelling: `tf32` or `f32`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Tf32 => "tf32",
            Precision::F32 => "f32",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A precision that is neither `tf32` nor `f32`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown matmul precision `{0}`: expected tf32 or f32")]
pub struct UnknownPrecision(pub String);

impl FromStr for Precision {
    type Err = UnknownPrecision;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "tf32" => Ok(Precision::Tf32),
            "f32" => Ok(Precision::F32),
            _ => Err(UnknownPrecision(s.to_string())),
        }
    }
}

/// One of cubek-matmul 0.2's strategies, by drove's name for it: the
/// candidates of the sweep and the values of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kernel {
    /// cubek's default (burn's only kernel): single buffer, cyclic loads, CMMA.
    SimpleCyclicCmma,
    /// As [`Kernel::SimpleCyclicCmma`] on the MMA instructions.
    SimpleCyclicMma,
    /// Double-buffered stages, cyclic loads, CMMA.
    DoubleCyclicCmma,
    /// Double-buffered stages, cyclic loads, MMA.
    DoubleCyclicMma,
    /// Double buffering with ordered loads, CMMA.
    OrderedDoubleCmma,
    /// Double buffering with ordered loads, MMA.
    OrderedDoubleMma,
    /// Single buffer loaded by the tensor memory accelerator (Hopper), CMMA.
    SimpleTmaCmma,
    /// Single buffer loaded by TMA, MMA.
    SimpleTmaMma,
    /// Warp-specialised loaders through TMA, CMMA.
    SpecializedTmaCmma,
    /// Warp-specialised loaders through TMA, MMA.
    SpecializedTmaMma,
    /// No tensor cores: each thread a register tile, f32 throughout, one buffer.
    SimpleUnit,
    /// No tensor cores, f32 throughout, double-buffered.
    DoubleUnit,
}

impl Kernel {
    /// Every kernel the sweep times, the default first.
    pub const ALL: [Kernel; 12] = [
        Kernel::SimpleCyclicCmma,
        Kernel::SimpleCyclicMma,
        Kernel::DoubleCyclicCmma,
        Kernel::DoubleCyclicMma,
        Kernel::OrderedDoubleCmma,
        Kernel::OrderedDoubleMma,
        Kernel::SimpleTmaCmma,
        Kernel::SimpleTmaMma,
        Kernel::SpecializedTmaCmma,
        Kernel::SpecializedTmaMma,
        Kernel::SimpleUnit,
        Kernel::DoubleUnit,
    ];

    /// The kernel cubek runs when a tensor-core one is unavailable on the
    /// device (as cubek's `Auto` does, `launch/strategy.rs:561-567`).
    pub const FALLBACK: Kernel = Kernel::SimpleUnit;

    /// drove's name (the JSON's `strategy`).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::SimpleCyclicCmma => "simple_cyclic_cmma",
            Kernel::SimpleCyclicMma => "simple_cyclic_mma",
            Kernel::DoubleCyclicCmma => "double_cyclic_cmma",
            Kernel::DoubleCyclicMma => "double_cyclic_mma",
            Kernel::OrderedDoubleCmma => "ordered_double_cmma",
            Kernel::OrderedDoubleMma => "ordered_double_mma",
            Kernel::SimpleTmaCmma => "simple_tma_cmma",
            Kernel::SimpleTmaMma => "simple_tma_mma",
            Kernel::SpecializedTmaCmma => "specialized_tma_cmma",
            Kernel::SpecializedTmaMma => "specialized_tma_mma",
            Kernel::SimpleUnit => "simple_unit",
            Kernel::DoubleUnit => "double_unit",
        }
    }

    /// Whether it multiplies on tensor cores, which stage f32 as TF32 where
    /// the device has them (see the module's documentation).
    pub fn uses_tensor_cores(self) -> bool {
        !matches!(self, Kernel::SimpleUnit | Kernel::DoubleUnit)
    }

    /// Whether its inner products are f32 at `precision` on every device:
    /// always at TF32 (allowed, not required), without tensor cores at f32.
    pub fn honours(self, precision: Precision) -> bool {
        precision == Precision::Tf32 || !self.uses_tensor_cores()
    }

    /// cubek's strategy, its blueprint inferred from the problem.
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    pub fn cubek(self) -> Strategy {
        match self {
            Kernel::SimpleCyclicCmma => Strategy::SimpleCyclicCmma(Default::default()),
            Kernel::SimpleCyclicMma => Strategy::SimpleCyclicMma(Default::default()),
            Kernel::DoubleCyclicCmma => Strategy::DoubleCyclicCmma(Default::default()),
            Kernel::DoubleCyclicMma => Strategy::DoubleCyclicMma(Default::default()),
            Kernel::OrderedDoubleCmma => Strategy::OrderedDoubleCmma(Default::default()),
            Kernel::OrderedDoubleMma => Strategy::OrderedDoubleMma(Default::default()),
            Kernel::SimpleTmaCmma => Strategy::SimpleTmaCmma(Default::default()),
            Kernel::SimpleTmaMma => Strategy::SimpleTmaMma(Default::default()),
            Kernel::SpecializedTmaCmma => Strategy::SpecializedTmaCmma(Default::default()),
            Kernel::SpecializedTmaMma => Strategy::SpecializedTmaMma(Default::default()),
            Kernel::SimpleUnit => Strategy::SimpleUnit(Default::default()),
            Kernel::DoubleUnit => Strategy::DoubleUnit(Default::default()),
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A kernel name that is not one of [`Kernel::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown matmul kernel `{0}`: expected one of {names}", names = Kernel::ALL.map(Kernel::name).join(", "))]
pub struct UnknownKernel(pub String);

impl FromStr for Kernel {
    type Err = UnknownKernel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Kernel::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| UnknownKernel(s.to_string()))
    }
}

/// The shape of one GEMM: `batch` products of `[m, k] x [k, n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Gemm {
    /// Rows of the left operand and the output.
    pub m: usize,
    /// Columns of the right operand and the output.
    pub n: usize,
    /// The summed dimension.
    pub k: usize,
    /// Products in the batch (1 for a 2-D matmul; the product of the batch
    /// dimensions of the output otherwise).
    pub batch: usize,
}

impl Gemm {
    /// Multiply-adds times two.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.batch as f64
    }

    /// Its class in the table.
    pub fn class(&self) -> ShapeClass {
        let dims = [self.m, self.n, self.k];
        if dims.iter().filter(|&&d| d <= TINY).count() >= 2 {
            ShapeClass::Tiny
        } else if self.batch > 1 {
            ShapeClass::Batched
        } else if self.k > self.m && self.k > self.n {
            ShapeClass::LongK
        } else {
            ShapeClass::Dense
        }
    }
}

/// Two dimensions at most this make a problem cubek's selector calls tiny
/// (one 16x16 tile a cube, `routines/selector/mod.rs:16-25`).
const TINY: usize = 32;

/// The classes of the table, each a kind of GEMM in a BERT step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShapeClass {
    /// Two of m, n, k at most 32 (attention at short lengths).
    Tiny,
    /// Several products at once (attention's scores and context, and their
    /// gradients).
    Batched,
    /// k the largest dimension: a dense layer's weight gradient
    /// (`[in, tokens] x [tokens, out]`), where cubes are few and K loops long.
    LongK,
    /// A dense layer's forward or data gradient (`[tokens, in] x [in, out]`).
    Dense,
}

/// The kernel for `gemm` at `precision`: the table, until a GPU sweep sets
/// it, today's default at TF32 and the unit kernel at f32 in every class.
pub fn choose(gemm: Gemm, precision: Precision) -> Kernel {
    match (precision, gemm.class()) {
        (Precision::Tf32, ShapeClass::Tiny | ShapeClass::Batched | ShapeClass::LongK | ShapeClass::Dense) => {
            Kernel::SimpleCyclicCmma
        }
        (Precision::F32, ShapeClass::Tiny | ShapeClass::Batched | ShapeClass::LongK | ShapeClass::Dense) => {
            Kernel::SimpleUnit
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemm(m: usize, n: usize, k: usize, batch: usize) -> Gemm {
        Gemm { m, n, k, batch }
    }

    #[test]
    fn minilm_gemms_fall_in_their_classes() {
        let tokens = 32 * 128;
        // A dense layer: forward, data gradient, weight gradient.
        assert_eq!(gemm(tokens, 1536, 384, 1).class(), ShapeClass::Dense);
        assert_eq!(gemm(tokens, 384, 1536, 1).class(), ShapeClass::Dense);
        assert_eq!(gemm(384, 1536, tokens, 1).class(), ShapeClass::LongK);
        // Attention scores and context at L = 128, 12 heads of 32.
        assert_eq!(gemm(128, 128, 32, 32 * 12).class(), ShapeClass::Batched);
        assert_eq!(gemm(128, 32, 128, 32 * 12).class(), ShapeClass::Batched);
        // At L = 32 two dimensions are 32: tiny.
        assert_eq!(gemm(32, 32, 32, 32 * 12).class(), ShapeClass::Tiny);
        assert_eq!(gemm(32, 128, 32, 1).class(), ShapeClass::Tiny);
    }

    #[test]
    fn the_table_before_a_sweep_is_todays_default_at_tf32_and_unit_at_f32() {
        for shape in
            [gemm(4096, 384, 384, 1), gemm(384, 384, 4096, 1), gemm(128, 128, 32, 384), gemm(16, 16, 64, 1)]
        {
            assert_eq!(choose(shape, Precision::Tf32), Kernel::SimpleCyclicCmma, "{shape:?}");
            assert_eq!(choose(shape, Precision::F32), Kernel::SimpleUnit, "{shape:?}");
        }
    }

    #[test]
    fn f32_never_gets_tensor_cores_whatever_the_shape() {
        for m in [1, 16, 32, 33, 384, 8192] {
            for n in [1, 32, 384, 1536] {
                for k in [1, 32, 384, 32768] {
                    for batch in [1, 2, 3072] {
                        let shape = gemm(m, n, k, batch);
                        let kernel = choose(shape, Precision::F32);
                        assert!(kernel.honours(Precision::F32), "{shape:?} -> {kernel}");
                    }
                }
            }
        }
    }

    #[test]
    fn names_and_precisions_parse_back() {
        for kernel in Kernel::ALL {
            assert_eq!(kernel.name().parse::<Kernel>(), Ok(kernel));
            #[cfg(any(feature = "cuda", feature = "wgpu"))]
            assert!(kernel.cubek().to_string().starts_with("matmul_"), "{kernel}");
        }
        assert!("fast".parse::<Kernel>().unwrap_err().to_string().contains("simple_unit"));
        assert_eq!("TF32".parse::<Precision>(), Ok(Precision::Tf32));
        assert_eq!("f32".parse::<Precision>(), Ok(Precision::F32));
        assert_eq!(
            "bf16".parse::<Precision>().unwrap_err().to_string(),
            "unknown matmul precision `bf16`: expected tf32 or f32"
        );
        assert_eq!(Precision::default(), Precision::Tf32);
    }

    #[test]
    fn only_unit_kernels_keep_f32_without_tensor_cores() {
        let unit: Vec<_> = Kernel::ALL.into_iter().filter(|k| !k.uses_tensor_cores()).collect();
        assert_eq!(unit, [Kernel::SimpleUnit, Kernel::DoubleUnit]);
        assert!(!Kernel::FALLBACK.uses_tensor_cores());
    }
}

//! [`GpuStep`]: how a training step is computed on a GPU, one switch for
//! each of the changes that made it faster (issue 49), so that one binary can
//! compare a step with and without each on the same batches.
//!
//! Changes that compute the same numbers and only remove work are on by
//! default; changes that alter the order of floating-point sums stay off
//! until a GPU has shown them faster. On the CPU every switch either has no
//! effect or keeps the CPU's own path, as its help says.

/// How a GPU step is computed (flags of `drove train ner` and `drove bench train`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default)]
pub struct GpuStep {
    /// Which matmul the model's layers use on a GPU: burn's own (one TF32
    /// tensor-core kernel for every shape) or drove's, which picks cubek's
    /// kernel per shape class. At --matmul-precision f32 drove's runs either
    /// way (burn's cannot keep f32). The CPU always takes burn's.
    #[cfg_attr(feature = "clap", arg(long, value_enum, value_name = "burn|drove", default_value = "burn"))]
    pub matmul: MatmulChoice,
    /// The arithmetic of GPU matmuls (PyTorch's allow_tf32): tf32 lets
    /// tensor cores round f32 operands to TF32 (10-bit mantissa); f32 keeps
    /// f32 throughout, on kernels without tensor cores. No effect on the CPU.
    #[cfg_attr(feature = "clap", arg(long, value_name = "tf32|f32", default_value = "tf32"))]
    pub matmul_precision: drove_kernels::matmul::Precision,
}

/// `--matmul`: whose matmul the model's layers use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum MatmulChoice {
    /// burn's `matmul`.
    #[default]
    Burn,
    /// drove's ([`drove_kernels::matmul`]): cubek's kernel chosen per shape.
    Drove,
}

impl GpuStep {
    /// The matmul `--matmul` and `--matmul-precision` ask for: burn's only
    /// at burn and TF32.
    pub fn matmul_op(&self) -> drove_kernels::matmul::Matmul {
        use drove_kernels::matmul::{Matmul, Precision};
        match (self.matmul, self.matmul_precision) {
            (MatmulChoice::Burn, Precision::Tf32) => Matmul::Burn,
            (_, precision) => Matmul::Drove(precision),
        }
    }
}

#[cfg(test)]
mod matmul_tests {
    use drove_kernels::matmul::{Matmul, Precision};

    use super::*;

    #[test]
    fn burns_matmul_by_default_and_drove_s_wherever_f32_is_asked() {
        assert_eq!(GpuStep::default().matmul_op(), Matmul::Burn);
        let step = |matmul, matmul_precision| GpuStep { matmul, matmul_precision, ..GpuStep::default() };
        assert_eq!(step(MatmulChoice::Drove, Precision::Tf32).matmul_op(), Matmul::Drove(Precision::Tf32));
        assert_eq!(step(MatmulChoice::Burn, Precision::F32).matmul_op(), Matmul::Drove(Precision::F32));
        assert_eq!(step(MatmulChoice::Drove, Precision::F32).matmul_op(), Matmul::Drove(Precision::F32));
    }
}

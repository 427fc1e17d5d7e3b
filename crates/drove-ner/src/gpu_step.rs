//! [`GpuStep`]: how a training step is computed on a GPU, one switch for
//! each of the changes that made it faster (issue 49), so that one binary can
//! compare a step with and without each on the same batches.
//!
//! Changes that compute the same numbers and only remove work are on by
//! default; changes that alter the order of floating-point sums stay off
//! until a GPU has shown them faster. On the CPU every switch either has no
//! effect, keeps the CPU's own path, or (the order of sums) applies there
//! too, as its help says.

/// How a GPU step is computed (flags of `drove train ner` and `drove bench train`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default)]
pub struct GpuStep {
    /// When a step's loss is read back on the backend placement (a GPU's):
    /// at-update keeps it on the device, where alone it guards the update
    /// (a loss or gradient norm that is not finite changes nothing) and is
    /// read with the gradient norm, one blocking read a step; after-forward
    /// reads it before backward is queued. The same numbers either way.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "at-update|after-forward", default_value = "at-update")
    )]
    pub loss_read: drove_train::LossRead,
    /// How dense layers sum their weight and bias gradients over tokens:
    /// split-k splits the rows into up to 16 chunks (batched GEMMs summed
    /// over the chunks, the bias summed over the batch, then the sequence);
    /// plain, one GEMM and one sum over all rows. Sums in another order, so
    /// off by default; applies on the CPU too.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_enum, value_name = "plain|split-k", default_value = "plain")
    )]
    pub dense: DenseGrad,
    /// How the embedding tables' gradients are summed: sliced broadcasts
    /// the position table's first rows over the batch and type row 0 to
    /// every token (their gradients are sums, not burn's select-assign) and,
    /// on a GPU, sums the word table's rows by drove's deterministic scatter
    /// (tokens sorted by id on the device); select looks every token up.
    /// Sums in another order, so off by default; applies on the CPU too.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_enum, value_name = "select|sliced", default_value = "select")
    )]
    pub embedding_grad: EmbeddingGrad,
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
    /// Where dropout masks are drawn on a GPU: device computes each mask
    /// value in a kernel where it is used (and again for the gradient);
    /// host draws them on one thread and uploads them, as the CPU does. The
    /// same masks bit for bit either way.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_enum, value_name = "device|host", default_value = "device")
    )]
    pub dropout_masks: DropoutMasks,
    /// Whether a GPU run compiles the kernels of every padded length the
    /// training data has (one throw-away forward and backward each) before
    /// its first step, so that no step waits on a compile mid-run. No effect
    /// on the CPU.
    #[cfg_attr(feature = "clap", arg(long, value_enum, value_name = "on|off", default_value = "on"))]
    pub prewarm: Prewarm,
}

/// `--dropout-masks`: where a GPU draws dropout masks ([`drove_bert::Masks`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum DropoutMasks {
    /// By a kernel on the device.
    #[default]
    Device,
    /// On the host, uploaded.
    Host,
}

/// `--prewarm`: whether a GPU run compiles every padded length first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Prewarm {
    /// One forward and backward at each padded length before the first step.
    #[default]
    On,
    /// Kernels compiled when a step first needs them.
    Off,
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

/// `--dense`: how dense layers sum their gradients over tokens
/// ([`drove_bert::DenseSums`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum DenseGrad {
    /// One GEMM and one bias sum over all `batch * seq` rows.
    #[default]
    Plain,
    /// The rows in chunks of at least 512 (at most 16 chunks).
    SplitK,
}

/// `--embedding-grad`: how the embedding tables' gradients are summed
/// ([`drove_bert::EmbeddingSums`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum EmbeddingGrad {
    /// Every token's position and type looked up (burn's select).
    #[default]
    Select,
    /// Sliced tables broadcast over the batch.
    Sliced,
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

    /// Where dropout masks are drawn, as drove-bert names it.
    pub fn masks(&self) -> drove_bert::Masks {
        match self.dropout_masks {
            DropoutMasks::Device => drove_bert::Masks::Device,
            DropoutMasks::Host => drove_bert::Masks::Host,
        }
    }

    /// The model's layout of its backward's sums these switches ask for.
    pub fn sum_order(&self) -> drove_bert::SumOrder {
        drove_bert::SumOrder {
            dense: match self.dense {
                DenseGrad::Plain => drove_bert::DenseSums::Plain,
                DenseGrad::SplitK => drove_bert::DenseSums::split_k(),
            },
            embeddings: match self.embedding_grad {
                EmbeddingGrad::Select => drove_bert::EmbeddingSums::Select,
                EmbeddingGrad::Sliced => drove_bert::EmbeddingSums::Sliced,
            },
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

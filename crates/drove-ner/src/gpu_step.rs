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
pub struct GpuStep {}

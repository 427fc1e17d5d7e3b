//! `drove weights`: a safetensors file's floats rewritten as f16 or f32 (the
//! GPU check carries MiniLM as f16), by drove-safetensors.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Settings of `drove weights`.
#[derive(Debug, Args)]
pub struct WeightsArgs {
    /// The safetensors file to read.
    input: PathBuf,
    /// The safetensors file to write.
    output: PathBuf,
    /// The float type every float tensor is written as: f16 (half the bytes,
    /// for carrying) or f32 (to train from).
    #[arg(long, value_parser = ["f16", "f32"])]
    to: String,
}

/// `drove weights`: rewrites a safetensors file's f32 and f16 tensors as `--to`;
/// other tensors (integer ids, for one) are copied as they are.
pub fn weights(args: &WeightsArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let to: drove_safetensors::FloatType = args.to.parse().map_err(anyhow::Error::msg)?;
    let (written, count) = drove_safetensors::convert_floats(&bytes, to)
        .with_context(|| format!("converting {}", args.input.display()))?;
    std::fs::write(&args.output, written).with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("weights: {count} tensors written as {} to {}", args.to, args.output.display());
    Ok(())
}

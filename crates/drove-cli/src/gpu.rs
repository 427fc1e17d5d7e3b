//! The GPU side of the CLI: `--device cuda[:N]` for `drove train ner` and
//! `drove bench train` (a [`Gpu`] is drove-bench's [`Trainer`] there), and
//! `drove weights` (the f16 packing of the GPU check). Built with features
//! `cuda` and `nccl`; without them each says how to build it, and with them a
//! machine without a GPU gets one error naming the missing library (no panic).
//! `drove bench nccl` is drove-bench's (`bench.rs`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use drove_bench::train::Trainer;
use drove_comm::Collective;
use drove_ner::{NerError, NerOptions, NerSummary, Observer};
use drove_train::gpu::DeviceChoice;

/// A GPU opened for training (its checks passed).
pub struct Gpu {
    #[cfg(feature = "cuda")]
    ordinal: usize,
    #[cfg(feature = "cuda")]
    device: drove_train::cuda::CudaDevice,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(not(all(feature = "cuda", feature = "nccl")))]
pub(crate) const BUILD_HINT: &str = "this drove was built without GPU support: build it with \
     `cargo build --release -p drove-cli --features cuda,nccl` (the CUDA libraries are loaded at run time)";

/// Opens the GPU `choice` names (`cuda` alone: the one of `local_rank`, the
/// rank's place on its host, whichever launcher gave it), or `None` for the
/// CPU. Runs before the rank joins the others, so a missing GPU fails at once.
pub fn open(choice: DeviceChoice, local_rank: usize) -> anyhow::Result<Option<Gpu>> {
    let DeviceChoice::Cuda(n) = choice else { return Ok(None) };
    #[cfg(feature = "cuda")]
    {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let ordinal = drove_train::gpu::gpu_ordinal(n, local_rank, visible.as_deref());
        let device = drove_train::cuda::open_gpu(ordinal).with_context(|| format!("--device {choice}"))?;
        Ok(Some(Gpu { ordinal, device }))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (n, local_rank);
        anyhow::bail!("--device {choice}: {BUILD_HINT}")
    }
}

impl Gpu {
    /// Fine-tunes on this GPU: burn-cuda, the backend placement, and (feature
    /// `nccl`, more than one rank) gradient buckets all-reduced by NCCL in
    /// place; with one rank there is nothing to reduce.
    pub fn train_ner(
        &self,
        opts: &NerOptions,
        comm: &dyn Collective,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError> {
        #[cfg(feature = "cuda")]
        {
            use drove_train::cuda::Cuda;
            type Reducer = Box<dyn drove_train::device::BucketAllReduce<Cuda>>;
            #[cfg(feature = "nccl")]
            let reducer: Option<Reducer> = drove_train::cuda::gradient_reducer(
                comm,
                self.ordinal,
                self.device.clone(),
                drove_nccl::DeviceOptions::default(),
            )?
            .map(|buckets| {
                let by = buckets.describe();
                observer.note(&format!("rank {}: gradient all-reduce by {by}", comm.rank()));
                Box::new(buckets) as Reducer
            });
            #[cfg(not(feature = "nccl"))]
            let reducer: Option<Reducer> = None;
            drove_ner::train_ner_with::<drove_ner::backend::Autodiff<Cuda>>(
                opts,
                comm,
                observer,
                &self.device,
                reducer,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (opts, comm, observer);
            match self.never {}
        }
    }

    /// Bytes of GPU memory in use on the device (all processes), from the
    /// driver, with the GPU's primary context made current for the call.
    pub fn memory_used_bytes(&self) -> Option<u64> {
        #[cfg(feature = "cuda")]
        {
            drove_train::cuda::memory_used_bytes(self.ordinal)
                .map_err(|e| tracing::warn!("GPU memory in use: {e}"))
                .ok()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}

/// `drove bench train --device cuda`: the same fine-tune as `drove train ner`'s.
impl Trainer for Gpu {
    fn device(&self) -> DeviceChoice {
        #[cfg(feature = "cuda")]
        return DeviceChoice::Cuda(Some(self.ordinal));
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    fn train(&self, options: &NerOptions, observer: &mut dyn Observer) -> Result<NerSummary, NerError> {
        self.train_ner(options, &drove_comm::SingleProcess, observer)
    }

    fn memory_used_bytes(&self) -> Option<u64> {
        Gpu::memory_used_bytes(self)
    }
}

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

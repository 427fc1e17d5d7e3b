//! The fine-tune on a GPU: `--device cuda[:N]` opened before a rank joins the
//! others (so a missing GPU fails at once), and [`Gpu::train_ner`] wiring
//! burn-cuda, the backend placement and (feature `nccl`, more than one rank)
//! NCCL's in-place gradient all-reduce into [`train_ner_with`](crate::train_ner_with).
//!
//! Built with features `cuda` (and `nccl`); without them [`Gpu::open`] says
//! how to build a drove that has them, and with them a machine without a GPU
//! gets one error naming the missing library (no panic). `CUDA_VISIBLE_DEVICES`
//! is read here, where the device is opened.

use drove_collective::Collective;
use drove_train::gpu::DeviceChoice;

use crate::{NerError, NerOptions, NerSummary, Observer};

/// What a build without GPU support says when asked for a GPU.
pub const BUILD_HINT: &str = "this drove was built without GPU support: build it with \
     `cargo build --release -p drove-cli --features cuda,nccl` (the CUDA libraries are loaded at run time)";

/// A GPU opened for training (its checks passed).
pub struct Gpu {
    #[cfg(feature = "cuda")]
    ordinal: usize,
    #[cfg(feature = "cuda")]
    device: drove_train::cuda::CudaDevice,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("device", &self.device().to_string()).finish()
    }
}

impl Gpu {
    /// Opens the GPU `choice` names (`cuda` alone: the one of `local_rank`,
    /// the rank's place on its host, whichever launcher gave it, unless
    /// `CUDA_VISIBLE_DEVICES` shows one), or `None` for the CPU.
    pub fn open(choice: DeviceChoice, local_rank: usize) -> Result<Option<Gpu>, NerError> {
        let DeviceChoice::Cuda(n) = choice else { return Ok(None) };
        #[cfg(feature = "cuda")]
        {
            let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            let ordinal = drove_train::gpu::gpu_ordinal(n, local_rank, visible.as_deref());
            let device = drove_train::cuda::open_gpu(ordinal)
                .map_err(|source| NerError::Device { device: choice, source })?;
            Ok(Some(Gpu { ordinal, device }))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (n, local_rank);
            Err(NerError::Device { device: choice, source: drove_train::TrainError::Gpu(BUILD_HINT.into()) })
        }
    }

    /// The GPU, by its number (`cuda:N`).
    pub fn device(&self) -> DeviceChoice {
        #[cfg(feature = "cuda")]
        return DeviceChoice::Cuda(Some(self.ordinal));
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

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
            crate::train_ner_with::<crate::backend::Autodiff<Cuda>>(
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
    pub fn memory_used_bytes(&self) -> Result<u64, NerError> {
        #[cfg(feature = "cuda")]
        {
            drove_train::cuda::memory_used_bytes(self.ordinal)
                .map_err(|source| NerError::Device { device: self.device(), source })
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}

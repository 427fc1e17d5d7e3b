//! [`Gpu`]: the device `--device cuda[:N]` or `--device wgpu[:N]` names,
//! opened before a rank joins the others (so a missing GPU fails at once),
//! with the kernel cache configured first; [`list_devices`] for
//! `--device help`; and (feature `cuda`) [`cuda_gradient_path`], which of
//! NCCL and host staging averages a CUDA run's gradients.
//!
//! Built with features `cuda` (and `nccl`) or `wgpu`; without them
//! [`Gpu::open`] says how to build a drove that has them, and with them a
//! machine without the device gets one error naming what is missing (no
//! panic). `CUDA_VISIBLE_DEVICES` is read here, where the device is opened.

use crate::kernels::{self, Configured, Counting, KernelCache};
use crate::{DeviceChoice, DeviceError};

/// What a build without the asked-for GPU support says.
pub const BUILD_HINT: &str = "this drove was built without GPU support for that device: build it with \
     `cargo build --release -p drove-cli --features cuda,nccl` (NVIDIA GPUs; the CUDA libraries are loaded \
     at run time) or `--features wgpu` (any GPU with Vulkan, Metal or DX12)";

/// A GPU opened for training (its checks passed).
pub struct Gpu {
    opened: Opened,
    kernels: Configured,
}

/// Which backend's device a [`Gpu`] is.
pub enum Opened {
    /// A CUDA GPU: its number among those this process sees, and burn's device.
    #[cfg(feature = "cuda")]
    Cuda {
        /// `cuda:N`'s `N`.
        ordinal: usize,
        /// Burn's device for it.
        device: crate::cuda::CudaDevice,
    },
    /// A wgpu adapter, opened.
    #[cfg(feature = "wgpu")]
    Wgpu(crate::wgpu::OpenedAdapter),
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("device", &self.device().to_string()).finish()
    }
}

/// What `--device help` lists: the devices this build can train on.
pub fn list_devices() -> String {
    let mut out = String::from("cpu: burn's flex backend on this machine's cores\n");
    #[cfg(feature = "cuda")]
    out.push_str(
        "cuda, cuda:N: NVIDIA GPUs through burn's CUDA backend (cuda: the GPU of the rank's local rank)\n",
    );
    #[cfg(feature = "wgpu")]
    match crate::wgpu::adapters() {
        Ok(list) => out.push_str(&format!(
            "wgpu, wgpu:N: GPUs through burn's wgpu (wgpu: the adapter of the rank's local rank); adapters found:{}\n",
            crate::wgpu::describe(&list)
        )),
        Err(e) => out.push_str(&format!("wgpu: unavailable here: {e}\n")),
    }
    #[cfg(not(all(feature = "cuda", feature = "wgpu")))]
    out.push_str(&format!("(not in this build: {BUILD_HINT})\n"));
    out
}

impl Gpu {
    /// Opens the GPU `choice` names (`cuda` or `wgpu` alone: the one of
    /// `local_rank`, the rank's place on its host, whichever launcher gave
    /// it, unless `CUDA_VISIBLE_DEVICES` shows one CUDA GPU), or `None` for
    /// the CPU. `help` is an error holding the list of devices.
    pub fn open(choice: DeviceChoice, local_rank: usize) -> Result<Option<Gpu>, DeviceError> {
        Gpu::open_with(choice, local_rank, &KernelCache::Default, false)
    }

    /// [`Gpu::open`] with the kernel cache in `cache` and, with `count`,
    /// every kernel launched and compiled counted ([`kernels::configure`];
    /// the first GPU opened in a process sets both). CUDA's compiles are
    /// counted from its kernel cache instead (see [`Counting`]).
    pub fn open_with(
        choice: DeviceChoice,
        local_rank: usize,
        cache: &KernelCache,
        count: bool,
    ) -> Result<Option<Gpu>, DeviceError> {
        let counting =
            Counting { launches: count, compiles: count && matches!(choice, DeviceChoice::Wgpu(_)) };
        let kernels = match choice {
            DeviceChoice::Cuda(_) | DeviceChoice::Wgpu(_) => kernels::configure(cache, counting)?,
            _ => Configured { cache: None, counting: Counting::default() },
        };
        let _ = (local_rank, &kernels);
        match choice {
            DeviceChoice::Cpu => Ok(None),
            DeviceChoice::List => {
                Err(DeviceError::Gpu(format!("the devices of this drove:\n{}", list_devices())))
            }
            #[cfg(feature = "cuda")]
            DeviceChoice::Cuda(n) => {
                let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
                let ordinal = crate::gpu_ordinal(n, local_rank, visible.as_deref());
                let device = crate::cuda::open_gpu(ordinal)?;
                Ok(Some(Gpu { opened: Opened::Cuda { ordinal, device }, kernels }))
            }
            #[cfg(feature = "wgpu")]
            DeviceChoice::Wgpu(n) => {
                let index = match n {
                    Some(n) => n,
                    None => crate::adapter_for_local_rank(local_rank, crate::wgpu::adapters()?.len()),
                };
                let opened = crate::wgpu::open_adapter(index)?;
                Ok(Some(Gpu { opened: Opened::Wgpu(opened), kernels }))
            }
            #[allow(unreachable_patterns)]
            _ => Err(DeviceError::Gpu(BUILD_HINT.into())),
        }
    }

    /// Which backend's device this is, for a caller that picks the backend
    /// type by it.
    pub fn opened(&self) -> &Opened {
        &self.opened
    }

    /// The kernel cache and launch counting it was opened with.
    pub fn kernels(&self) -> &Configured {
        &self.kernels
    }

    /// The GPU, by its number (`cuda:N`, `wgpu:N`).
    pub fn device(&self) -> DeviceChoice {
        match self.opened {
            #[cfg(feature = "cuda")]
            Opened::Cuda { ordinal, .. } => DeviceChoice::Cuda(Some(ordinal)),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(ref o) => DeviceChoice::Wgpu(Some(o.adapter.index)),
        }
    }

    /// What trains, for the log at start: the device, and for wgpu the
    /// adapter's name, kind, graphics API and driver.
    pub fn describe(&self) -> String {
        match self.opened {
            #[cfg(feature = "cuda")]
            Opened::Cuda { ordinal, .. } => format!("cuda:{ordinal} (burn-cubecl on CUDA)"),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(ref o) => o.adapter.to_string(),
        }
    }

    /// The wgpu adapter, when this is one.
    #[cfg(feature = "wgpu")]
    pub fn adapter(&self) -> Option<&crate::wgpu::OpenedAdapter> {
        match self.opened {
            Opened::Wgpu(ref o) => Some(o),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Bytes of GPU memory in use on the device (all processes), from the
    /// driver, with the GPU's primary context made current for the call;
    /// `None` where the device does not tell (wgpu).
    pub fn memory_used_bytes(&self) -> Result<Option<u64>, DeviceError> {
        match self.opened {
            #[cfg(feature = "cuda")]
            Opened::Cuda { ordinal, .. } => crate::cuda::memory_used_bytes(ordinal).map(Some),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(_) => Ok(None),
        }
    }
}

/// How a CUDA run's gradients are averaged, and the one-line note that says
/// so (for rank 0's log), from [`cuda_gradient_path`].
#[cfg(feature = "cuda")]
pub struct CudaGradients {
    /// NCCL in device memory, or `None`: staged through the host collective.
    pub reducer: Option<Box<dyn crate::BucketAllReduce<crate::cuda::Cuda>>>,
    /// What was chosen and why, where there was a choice to tell.
    pub note: Option<String>,
}

/// The gradient all-reduce of a CUDA run in a fixed world, by `path`: NCCL
/// in device memory, or host staging through `comm`. `auto` takes NCCL
/// unless ranks share a GPU (NCCL before 2.30 refuses them), and says which
/// it took; alone, a rank has nothing to reduce.
#[cfg(feature = "cuda")]
pub fn cuda_gradient_path(
    path: crate::GradientPath,
    ordinal: usize,
    device: &crate::cuda::CudaDevice,
    comm: &dyn drove_collective::Collective,
) -> Result<CudaGradients, DeviceError> {
    use crate::GradientPath;
    let host = |note: Option<String>| Ok(CudaGradients { reducer: None, note });
    if comm.world_size() < 2 || path == GradientPath::Host {
        let told = comm.world_size() > 1 && comm.rank() == 0;
        return host(
            told.then(|| "gradient all-reduce staged through the host (--gradient-path host)".into()),
        );
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let identity = crate::gpu_identity(ordinal, visible.as_deref());
    let shared = crate::ranks_sharing_gpus(comm, &identity)?;
    if path == GradientPath::Auto && !shared.is_empty() {
        return host((comm.rank() == 0).then(|| {
            format!(
                "gradient all-reduce staged through the host: ranks {shared:?} share a GPU, which NCCL \
                 before 2.30 refuses (--gradient-path nccl to try it anyway)"
            )
        }));
    }
    #[cfg(feature = "nccl")]
    {
        let buckets = crate::cuda::gradient_reducer(
            comm,
            ordinal,
            device.clone(),
            drove_nccl::DeviceOptions::default(),
        )?;
        Ok(match buckets {
            Some(buckets) => CudaGradients {
                note: Some(format!("rank {}: gradient all-reduce by {}", comm.rank(), buckets.describe())),
                reducer: Some(Box::new(buckets)),
            },
            None => CudaGradients { reducer: None, note: None },
        })
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = device;
        match path {
            GradientPath::Nccl => Err(DeviceError::Gpu(
                "--gradient-path nccl: this drove was built without NCCL (build it with --features cuda,nccl)"
                    .into(),
            )),
            _ => host(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_opens_nothing_and_help_lists_the_devices() {
        assert!(Gpu::open(DeviceChoice::Cpu, 0).unwrap().is_none());
        let listed = Gpu::open(DeviceChoice::List, 0).unwrap_err().to_string();
        assert!(listed.starts_with("the devices of this drove:\ncpu: burn's flex backend"), "{listed}");
    }
}

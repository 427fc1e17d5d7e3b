//! The fine-tune on a GPU: `--device cuda[:N]` or `--device wgpu[:N]` opened
//! before a rank joins the others (so a missing GPU fails at once), and
//! [`Gpu::train_ner`] / [`Gpu::train_ner_elastic`] wiring the backend, the
//! backend placement and the gradient all-reduce into the fine-tune: NCCL in
//! place (feature `nccl`, CUDA, a fixed world of more than one rank), else
//! host staging through the [`Collective`] (wgpu, and every elastic run).
//!
//! Built with features `cuda` (and `nccl`) or `wgpu`; without them
//! [`Gpu::open`] says how to build a drove that has them, and with them a
//! machine without the device gets one error naming what is missing (no
//! panic). `CUDA_VISIBLE_DEVICES` is read here, where the device is opened.

use drove_collective::{Collective, Elastic};
use drove_train::gpu::DeviceChoice;
#[cfg(feature = "cuda")]
use drove_train::gpu::GradientPath;
use drove_train::kernels::KernelCache;

use crate::{NerError, NerOptions, NerSummary, Observer};

/// What a build without the asked-for GPU support says.
pub const BUILD_HINT: &str = "this drove was built without GPU support for that device: build it with \
     `cargo build --release -p drove-cli --features cuda,nccl` (NVIDIA GPUs; the CUDA libraries are loaded \
     at run time) or `--features wgpu` (any GPU with Vulkan, Metal or DX12)";

/// A GPU opened for training (its checks passed).
pub struct Gpu {
    opened: Opened,
    kernels: drove_train::kernels::Configured,
}

enum Opened {
    #[cfg(feature = "cuda")]
    Cuda { ordinal: usize, device: drove_train::cuda::CudaDevice },
    #[cfg(feature = "wgpu")]
    Wgpu(drove_train::wgpu::OpenedAdapter),
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
    match drove_train::wgpu::adapters() {
        Ok(list) => out.push_str(&format!(
            "wgpu, wgpu:N: GPUs through burn's wgpu (wgpu: the adapter of the rank's local rank); adapters found:{}\n",
            drove_train::wgpu::describe(&list)
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
    pub fn open(choice: DeviceChoice, local_rank: usize) -> Result<Option<Gpu>, NerError> {
        Gpu::open_with(choice, local_rank, &KernelCache::Default, false)
    }

    /// [`Gpu::open`] with the kernel cache in `cache` and, with `count`,
    /// every kernel launched and compiled counted
    /// ([`drove_train::kernels::configure`]; the first GPU opened in a
    /// process sets both). CUDA's compiles are counted from its kernel cache
    /// instead (see [`drove_train::kernels::Counting`]).
    pub fn open_with(
        choice: DeviceChoice,
        local_rank: usize,
        cache: &KernelCache,
        count: bool,
    ) -> Result<Option<Gpu>, NerError> {
        let counting = drove_train::kernels::Counting {
            launches: count,
            compiles: count && matches!(choice, DeviceChoice::Wgpu(_)),
        };
        let kernels = match choice {
            DeviceChoice::Cuda(_) | DeviceChoice::Wgpu(_) => drove_train::kernels::configure(cache, counting)
                .map_err(|reason| NerError::Device { device: choice, reason })?,
            _ => drove_train::kernels::Configured { cache: None, counting: Default::default() },
        };
        let _ = &kernels;
        let unsupported =
            || NerError::Device { device: choice, reason: drove_train::TrainError::Gpu(BUILD_HINT.into()) };
        let _ = (local_rank, &unsupported);
        match choice {
            DeviceChoice::Cpu => Ok(None),
            DeviceChoice::List => Err(NerError::Device {
                device: choice,
                reason: drove_train::TrainError::Gpu(format!(
                    "the devices of this drove:\n{}",
                    list_devices()
                )),
            }),
            #[cfg(feature = "cuda")]
            DeviceChoice::Cuda(n) => {
                let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
                let ordinal = drove_train::gpu::gpu_ordinal(n, local_rank, visible.as_deref());
                let device = drove_train::cuda::open_gpu(ordinal)
                    .map_err(|reason| NerError::Device { device: choice, reason })?;
                Ok(Some(Gpu { opened: Opened::Cuda { ordinal, device }, kernels }))
            }
            #[cfg(feature = "wgpu")]
            DeviceChoice::Wgpu(n) => {
                let device = |reason| NerError::Device { device: choice, reason };
                let index = match n {
                    Some(n) => n,
                    None => {
                        let count = drove_train::wgpu::adapters().map_err(device)?.len();
                        drove_train::gpu::adapter_for_local_rank(local_rank, count)
                    }
                };
                let opened = drove_train::wgpu::open_adapter(index).map_err(device)?;
                Ok(Some(Gpu { opened: Opened::Wgpu(opened), kernels }))
            }
            #[allow(unreachable_patterns)]
            _ => Err(unsupported()),
        }
    }

    /// The kernel cache and launch counting it was opened with.
    pub fn kernels(&self) -> &drove_train::kernels::Configured {
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
    pub fn adapter(&self) -> Option<&drove_train::wgpu::OpenedAdapter> {
        match self.opened {
            Opened::Wgpu(ref o) => Some(o),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Fine-tunes on this GPU in a fixed world: the backend placement, and
    /// gradient buckets all-reduced by NCCL in place (CUDA with feature
    /// `nccl`, more than one rank) or staged through the host and `comm`.
    pub fn train_ner(
        &self,
        opts: &NerOptions,
        comm: &dyn Collective,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError> {
        #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
        let _ = (opts, comm, observer);
        match self.opened {
            #[cfg(feature = "cuda")]
            Opened::Cuda { ordinal, ref device } => {
                use drove_train::cuda::Cuda;
                let reducer = cuda_reducer(opts.gradient_path, ordinal, device, comm, observer)?;
                crate::train_ner_with::<crate::backend::Autodiff<Cuda>>(opts, comm, observer, device, reducer)
            }
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(ref o) => self.guarded(o, observer, |observer| {
                crate::train_ner::<crate::backend::Autodiff<drove_train::wgpu::Wgpu>>(
                    opts, comm, observer, &o.device,
                )
            }),
        }
    }

    /// Fine-tunes on this GPU in an elastic world: gradients staged through
    /// the host and averaged by `comm`, so a re-formed world needs nothing of
    /// the device (no NCCL communicator to rebuild).
    pub fn train_ner_elastic(
        &self,
        opts: &NerOptions,
        comm: &dyn Elastic,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError> {
        #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
        let _ = (opts, comm, observer);
        match self.opened {
            #[cfg(feature = "cuda")]
            Opened::Cuda { .. } if opts.gradient_path == GradientPath::Nccl => Err(NerError::Options(
                "--gradient-path nccl: an elastic run stages its gradients through the host (a re-formed \
                 world would need a new NCCL communicator); leave the flag out or give host"
                    .into(),
            )),
            #[cfg(feature = "cuda")]
            Opened::Cuda { ref device, .. } => crate::train_ner_elastic::<
                crate::backend::Autodiff<drove_train::cuda::Cuda>,
            >(opts, comm, observer, device),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(ref o) => self.guarded(o, observer, |observer| {
                crate::train_ner_elastic::<crate::backend::Autodiff<drove_train::wgpu::Wgpu>>(
                    opts, comm, observer, &o.device,
                )
            }),
        }
    }

    /// Runs `train` with `observer` behind a step counter, turning a panic
    /// inside burn, cubecl or wgpu (how they report a lost device or a failed
    /// kernel) into an error naming the device, the step it failed after and,
    /// when wgpu said so, why it was lost. Checkpoints already written stay.
    #[cfg(feature = "wgpu")]
    fn guarded(
        &self,
        adapter: &drove_train::wgpu::OpenedAdapter,
        observer: &mut dyn Observer,
        train: impl FnOnce(&mut dyn Observer) -> Result<NerSummary, NerError>,
    ) -> Result<NerSummary, NerError> {
        let mut counted = Counted { inner: observer, done: None };
        let caught = drove_train::wgpu::catch_quietly(|| train(&mut counted));
        let failed = |what: String| {
            let after = match counted.done {
                Some(step) => format!("after step {step}"),
                None => "before the first step".into(),
            };
            let why = adapter.failure().map(|w| format!("; {w}")).unwrap_or_default();
            NerError::Device {
                device: self.device(),
                reason: drove_train::TrainError::Gpu(format!("{what} ({after}){why}")),
            }
        };
        match caught {
            Ok(Err(NerError::Train(drove_train::TrainError::Gpu(what)))) => Err(failed(what)),
            Ok(result) => result,
            Err(panic) => Err(failed(format!("the device failed mid-run: {panic}"))),
        }
    }

    /// Bytes of GPU memory in use on the device (all processes), from the
    /// driver, with the GPU's primary context made current for the call;
    /// `None` where the device does not tell (wgpu).
    pub fn memory_used_bytes(&self) -> Result<Option<u64>, NerError> {
        match self.opened {
            #[cfg(feature = "cuda")]
            Opened::Cuda { ordinal, .. } => drove_train::cuda::memory_used_bytes(ordinal)
                .map(Some)
                .map_err(|reason| NerError::Device { device: self.device(), reason }),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(_) => Ok(None),
        }
    }
}

/// The gradient all-reduce of a CUDA run in a fixed world, by `path`: NCCL
/// in device memory, or `None` (host staging through `comm`). `auto` takes
/// NCCL unless ranks share a GPU (NCCL before 2.30 refuses them), and says
/// which it took; alone, a rank has nothing to reduce.
#[cfg(feature = "cuda")]
fn cuda_reducer(
    path: GradientPath,
    ordinal: usize,
    device: &drove_train::cuda::CudaDevice,
    comm: &dyn Collective,
    observer: &mut dyn Observer,
) -> Result<Option<Box<dyn drove_train::device::BucketAllReduce<drove_train::cuda::Cuda>>>, NerError> {
    if comm.world_size() < 2 || path == GradientPath::Host {
        if comm.world_size() > 1 && comm.rank() == 0 {
            observer.note("gradient all-reduce staged through the host (--gradient-path host)");
        }
        return Ok(None);
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let identity = drove_train::gpu::gpu_identity(ordinal, visible.as_deref());
    let shared = drove_train::gpu::ranks_sharing_gpus(comm, &identity)?;
    if path == GradientPath::Auto && !shared.is_empty() {
        if comm.rank() == 0 {
            observer.note(&format!(
                "gradient all-reduce staged through the host: ranks {shared:?} share a GPU, which NCCL \
                 before 2.30 refuses (--gradient-path nccl to try it anyway)"
            ));
        }
        return Ok(None);
    }
    #[cfg(feature = "nccl")]
    {
        let buckets = drove_train::cuda::gradient_reducer(
            comm,
            ordinal,
            device.clone(),
            drove_nccl::DeviceOptions::default(),
        )?;
        Ok(buckets.map(|buckets| {
            let by = buckets.describe();
            observer.note(&format!("rank {}: gradient all-reduce by {by}", comm.rank()));
            Box::new(buckets) as Box<dyn drove_train::device::BucketAllReduce<drove_train::cuda::Cuda>>
        }))
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = device;
        match path {
            GradientPath::Nccl => Err(NerError::Options(
                "--gradient-path nccl: this drove was built without NCCL (build it with --features cuda,nccl)"
                    .into(),
            )),
            _ => Ok(None),
        }
    }
}

/// An observer that remembers the last step taken and hands everything on:
/// where a device failed, for its error.
#[cfg(feature = "wgpu")]
struct Counted<'a> {
    inner: &'a mut dyn Observer,
    done: Option<u64>,
}

#[cfg(feature = "wgpu")]
impl Observer for Counted<'_> {
    fn started(&mut self, done: u64, total: u64) {
        self.done = (done > 0).then_some(done);
        self.inner.started(done, total)
    }
    fn step(&mut self, report: &crate::StepReport) {
        self.done = Some(report.step);
        self.inner.step(report)
    }
    fn evaluated(&mut self, report: &crate::EvalReport) {
        self.inner.evaluated(report)
    }
    fn diagnosed(&mut self, report: &crate::DiagnoseReport) {
        self.inner.diagnosed(report)
    }
    fn alarm(&mut self, report: &crate::DiagnoseReport) {
        self.inner.alarm(report)
    }
    fn reformed(&mut self, report: &crate::ReformReport) {
        self.inner.reformed(report)
    }
    fn note(&mut self, message: &str) {
        self.inner.note(message)
    }
}

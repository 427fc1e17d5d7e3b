//! The fine-tune on a GPU that drove-device opened: [`open_gpu`] opens
//! `--device cuda[:N]` or `--device wgpu[:N]` before a rank joins the others
//! (so a missing GPU fails at once, naming the device), and [`GpuTraining`]
//! wires the backend, the backend placement and the gradient all-reduce into
//! the fine-tune: NCCL in place (feature `nccl`, CUDA, a fixed world of more
//! than one rank), else host staging through the [`Collective`] (wgpu, and
//! every elastic run). Which path, and why, is drove-device's
//! ([`drove_device::cuda_gradient_path`]); this file only picks the backend
//! type and calls the fine-tune with it.

use drove_collective::{Collective, Elastic};
#[cfg(feature = "cuda")]
use drove_device::GradientPath;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use drove_device::Opened;
use drove_device::kernels::KernelCache;
use drove_device::{DeviceChoice, Gpu};

use crate::{NerError, NerOptions, NerSummary, Observer};

/// Opens the GPU `choice` names for rank `local_rank` ([`Gpu::open_with`]:
/// the kernel cache in `cache`; with `count`, every kernel launched and
/// compiled counted), or `None` for the CPU; a failure names the device.
pub fn open_gpu(
    choice: DeviceChoice,
    local_rank: usize,
    cache: &KernelCache,
    count: bool,
) -> Result<Option<Gpu>, NerError> {
    Gpu::open_with(choice, local_rank, cache, count)
        .map_err(|reason| NerError::Device { device: choice, reason })
}

/// The fine-tune on an opened [`Gpu`].
pub trait GpuTraining {
    /// Fine-tunes on this GPU in a fixed world: the backend placement, and
    /// gradient buckets all-reduced by NCCL in place (CUDA with feature
    /// `nccl`, more than one rank) or staged through the host and `comm`.
    fn train_ner(
        &self,
        opts: &NerOptions,
        comm: &dyn Collective,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError>;

    /// Fine-tunes on this GPU in an elastic world: gradients staged through
    /// the host and averaged by `comm`, so a re-formed world needs nothing of
    /// the device (no NCCL communicator to rebuild).
    fn train_ner_elastic(
        &self,
        opts: &NerOptions,
        comm: &dyn Elastic,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError>;
}

// `#[inline]`: the fit loop is instantiated for the CUDA and wgpu backends in
// the crate that calls these (drove-cli, drove-bench), at that crate's
// optimisation level, not here. drove-ner's dev profile is opt-level 3 for the
// CPU tests' sake, and instantiating two GPU backends at that level made
// drove-ner the longest unit of CI's build (443 s of its 13 minutes, on the
// critical path); a release build optimises them wherever they are.
impl GpuTraining for Gpu {
    #[inline]
    fn train_ner(
        &self,
        opts: &NerOptions,
        comm: &dyn Collective,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError> {
        #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
        let _ = (opts, comm, observer);
        match *self.opened() {
            #[cfg(feature = "cuda")]
            Opened::Cuda { ordinal, ref device } => {
                use drove_device::cuda::Cuda;
                let gradients = drove_device::cuda_gradient_path(opts.gradient_path, ordinal, device, comm)
                    .map_err(|reason| NerError::Device { device: self.device(), reason })?;
                if let Some(note) = &gradients.note {
                    observer.note(note);
                }
                crate::train_ner_with::<crate::backend::Autodiff<Cuda>>(
                    opts,
                    comm,
                    observer,
                    device,
                    gradients.reducer,
                )
            }
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(ref o) => guarded(self, o, observer, |observer| {
                crate::train_ner::<crate::backend::Autodiff<drove_device::wgpu::Wgpu>>(
                    opts, comm, observer, &o.device,
                )
            }),
        }
    }

    #[inline]
    fn train_ner_elastic(
        &self,
        opts: &NerOptions,
        comm: &dyn Elastic,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError> {
        #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
        let _ = (opts, comm, observer);
        match *self.opened() {
            #[cfg(feature = "cuda")]
            Opened::Cuda { .. } if opts.gradient_path == GradientPath::Nccl => Err(NerError::Options(
                "--gradient-path nccl: an elastic run stages its gradients through the host (a re-formed \
                 world would need a new NCCL communicator); leave the flag out or give host"
                    .into(),
            )),
            #[cfg(feature = "cuda")]
            Opened::Cuda { ref device, .. } => crate::train_ner_elastic::<
                crate::backend::Autodiff<drove_device::cuda::Cuda>,
            >(opts, comm, observer, device),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu(ref o) => guarded(self, o, observer, |observer| {
                crate::train_ner_elastic::<crate::backend::Autodiff<drove_device::wgpu::Wgpu>>(
                    opts, comm, observer, &o.device,
                )
            }),
        }
    }
}

/// Runs `train` with `observer` behind a step counter, turning a panic
/// inside burn, cubecl or wgpu (how they report a lost device or a failed
/// kernel) into an error naming the device, the step it failed after and,
/// when wgpu said so, why it was lost. Checkpoints already written stay.
#[cfg(feature = "wgpu")]
fn guarded(
    gpu: &Gpu,
    adapter: &drove_device::wgpu::OpenedAdapter,
    observer: &mut dyn Observer,
    train: impl FnOnce(&mut dyn Observer) -> Result<NerSummary, NerError>,
) -> Result<NerSummary, NerError> {
    use drove_device::DeviceError;
    use drove_train::TrainError;
    let mut counted = Counted { inner: observer, done: None };
    let caught = drove_device::wgpu::catch_quietly(|| train(&mut counted));
    let failed = |what: String| {
        let after = match counted.done {
            Some(step) => format!("after step {step}"),
            None => "before the first step".into(),
        };
        let why = adapter.failure().map(|w| format!("; {w}")).unwrap_or_default();
        NerError::Device { device: gpu.device(), reason: DeviceError::Gpu(format!("{what} ({after}){why}")) }
    };
    match caught {
        Ok(Err(NerError::Train(TrainError::Device(DeviceError::Gpu(what))))) => Err(failed(what)),
        Ok(result) => result,
        Err(panic) => Err(failed(format!("the device failed mid-run: {panic}"))),
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

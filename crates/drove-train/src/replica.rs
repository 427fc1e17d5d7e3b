//! [`Replica`]: one rank's copy of a burn model and the distributed step that
//! trains it, as Horovod's `DistributedOptimizer` (with `broadcast_parameters`
//! and `broadcast_optimizer_state`) is for PyTorch.
//!
//! ```no_run
//! # use burn::backend::{Autodiff, Flex};
//! # use burn::nn::{Linear, LinearConfig, loss::{MseLoss, Reduction}};
//! # use burn::tensor::{Tensor, TensorData};
//! # use drove_train::{Replica, ReplicaOptions};
//! # type B = Autodiff<Flex>;
//! # fn main() -> Result<(), drove_train::TrainError> {
//! let device = Default::default();
//! let comm = drove_collective::SingleProcess; // or drove_launch::connect_from_env()? under `drove run`
//! let model: Linear<B> = LinearConfig::new(4, 1).init(&device);
//! // Broadcasts rank 0's parameters to every rank.
//! let mut replica = Replica::new(model, &comm, ReplicaOptions { lr: 1e-2, ..ReplicaOptions::default() }, &device)?;
//! let batch: Vec<([f32; 4], f32)> = vec![([1.0, 2.0, 3.0, 4.0], 1.0); 16];
//! let outcome = replica.step(&batch, |model, part| {
//!     let rows = &part.batch[part.rows.clone()];
//!     let x: Vec<f32> = rows.iter().flat_map(|(x, _)| *x).collect();
//!     let y: Vec<f32> = rows.iter().map(|(_, y)| *y).collect();
//!     let x = Tensor::<B, 2>::from_data(TensorData::new(x, [rows.len(), 4]), &device);
//!     let y = Tensor::<B, 2>::from_data(TensorData::new(y, [rows.len(), 1]), &device);
//!     MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
//! })?;
//! println!("loss {:.4}", outcome.global_loss.unwrap_or(outcome.local_loss));
//! # Ok(()) }
//! ```
//!
//! A step: the rank's batch is split by rows into micro-batches that run at
//! once (one thread pool each, see [`crate::micro`]); their gradients, and
//! those of up to `backward_passes_per_step` calls, are summed; then the sum is
//! averaged across ranks (fused into buckets), clipped by its global norm, and
//! applied by AdamW at the scheduled learning rate. Where the parameters,
//! gradients and optimizer state live is the [`Placement`]:
//! [`Placement::Host`] keeps them as flat `f32` buffers (the CPU fast path),
//! [`Placement::Backend`] as tensors on the backend's device (the GPU path,
//! whose one host crossing is [`BucketAllReduce`]). The replica holds the one
//! placement its options name, which keeps the gradients it takes in its own
//! form, so the two placements' gradients and states never mix.
//!
//! [`Placement`]: crate::Placement
//! [`Placement::Host`]: crate::Placement::Host
//! [`Placement::Backend`]: crate::Placement::Backend

use std::path::{Path, PathBuf};
use std::time::Duration;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use drove_collective::fusion::Plan;
use drove_collective::{Buffer, Collective, Element};

use crate::TrainError;
use crate::checkpoint;
use crate::flat::{FlatAdamW, FlatParams, decays};
use crate::gradients::GradientAllReduce;
use crate::micro::MicroBatches;
use crate::overlap::Overlap;
use crate::placement::{Gradients, Placement, PlacementStep, Reset, StartState};
use crate::timeline::Timeline;
use drove_device::BucketAllReduce;

mod options;
mod outcome;
mod overlapped;
mod resync;
mod rows;
mod step;

pub use crate::phase::PhaseTimes;
pub use options::{LossRead, LossReduction, ReplicaOptions};
pub use outcome::StepOutcome;
pub use resync::Resynced;
pub use rows::{Micro, Rows, split_rows};

/// The timeline of a replica that records none.
static OFF: std::sync::LazyLock<Timeline> = std::sync::LazyLock::new(Timeline::off);

/// One rank's replica of a model and its distributed step.
///
/// Built by [`Replica::new`], which broadcasts the root's parameters;
/// [`Replica::load`] resumes every rank from one checkpoint and checks that
/// they agree. [`Replica::step`] takes this rank's batch and a loss closure.
pub struct Replica<'c, B: AutodiffBackend, M: AutodiffModule<B>> {
    model: Option<M>,
    comm: &'c dyn Collective,
    options: ReplicaOptions,
    device: B::Device,
    names: Vec<String>,
    shapes: Vec<Vec<usize>>,
    /// The one door of the gradient all-reduce, with its buckets (the same
    /// on every rank).
    all_reduce: GradientAllReduce<'c, B::InnerBackend>,
    /// Parameters, optimizer state and the gradients summed over this
    /// step's passes so far, where `options.placement` says.
    placement: Box<dyn PlacementStep<B, M>>,
    /// The gradients the next update takes: none before a backward pass,
    /// the placement's own, or those an overlapped pass averaged.
    pending: Option<Gradients>,
    micro: MicroBatches,
    passes: usize,
    local_loss: f64,
    /// The step's losses so far, kept on the device ([`LossRead::AtUpdate`]):
    /// each pass's micro-batch losses in order, added up on the host once
    /// read, in the order the host adds values it reads at once.
    deferred_loss: Vec<Vec<Tensor<B::InnerBackend, 1>>>,
    compute: Duration,
    /// The overlapped passes' all-reduce time left after backward ended.
    exposed: Duration,
    /// The overlapped passes' all-reduce time, hidden or not.
    communication: Duration,
    /// Hook levels and what the overlapped passes keep.
    overlap: Overlap<B::InnerBackend>,
    /// Where the step's phases are recorded (off unless set).
    timeline: &'c Timeline,
}

impl<'c, B: AutodiffBackend, M: AutodiffModule<B>> Replica<'c, B, M> {
    /// Makes `model` this rank's replica: checks `options`, broadcasts the root
    /// rank's parameters (so every rank starts from the same weights, whatever
    /// it initialised) and sets up the optimizer state where `options.placement`
    /// says. Every rank calls this with the same model type and options.
    pub fn new(
        model: M,
        comm: &'c dyn Collective,
        options: ReplicaOptions,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        options.check(comm.world_size())?;
        // One read: the broadcast buffers are the host placement's parameters.
        let mut params = FlatParams::read(&model)?;
        crate::exchange::broadcast_flat(&mut params, comm, options.root)?;
        let model = params.write(model, device);
        Self::assemble(model, params, comm, options, device)
    }

    /// The replica of `model`, whose parameters `params` holds, with its
    /// placement started.
    fn assemble(
        model: M,
        params: FlatParams,
        comm: &'c dyn Collective,
        options: ReplicaOptions,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        let decay: Vec<bool> = params.names.iter().map(|n| decays(n, &options.no_decay)).collect();
        let micro = MicroBatches::new(
            MicroBatches::resolve(options.micro_batches, usize::MAX),
            rayon::current_num_threads(),
        )?;
        let (names, shapes) = (params.names.clone(), params.shapes.clone());
        let keep_local = match &options.keep_local_gradient {
            None => None,
            Some(name) => Some(names.iter().position(|n| n == name).ok_or_else(|| TrainError::Options {
                field: "keep_local_gradient",
                message: format!(
                    "must name a parameter, found {name:?}; some that are: {:?}",
                    &names[names.len().saturating_sub(6)..]
                ),
            })?),
        };
        let bytes: Vec<usize> = shapes.iter().map(|s| s.iter().product::<usize>() * 4).collect();
        let layouts = options.sparse_rows.layouts(&names, &shapes);
        let buckets = Plan::new(&bytes, &layouts, options.fusion.threshold_bytes);
        let all_reduce = GradientAllReduce::new(comm, buckets, options.fusion.compression);
        let start = StartState { params, adamw: options.adamw, decay, device };
        let placement = options.placement.start(start);
        Ok(Replica {
            model: Some(model),
            comm,
            options,
            device: device.clone(),
            names,
            shapes,
            all_reduce,
            placement,
            pending: None,
            micro,
            passes: 0,
            deferred_loss: Vec::new(),
            local_loss: 0.0,
            compute: Duration::ZERO,
            exposed: Duration::ZERO,
            communication: Duration::ZERO,
            overlap: Overlap::new(keep_local),
            timeline: &OFF,
        })
    }

    /// Records the step's phases (forward and backward per micro-batch, the
    /// loss and gradient all-reduces, clipping, the optimizer) on `timeline`.
    pub fn with_timeline(mut self, timeline: &'c Timeline) -> Self {
        self.timeline = timeline;
        self
    }

    /// Replaces the bucket all-reduce of the [`Placement::Backend`] placement
    /// (host staging by default) with `reducer`, e.g. a device collective.
    ///
    /// The replica's passes then overlap no all-reduce with backward (the
    /// reducer averages after it).
    ///
    /// # Errors
    /// On a host-placed replica, which has no buckets on the device.
    pub fn with_bucket_all_reduce(
        mut self,
        reducer: Box<dyn BucketAllReduce<B::InnerBackend>>,
    ) -> Result<Self, TrainError> {
        if self.options.placement != Placement::Backend {
            return Err(TrainError::NotOnDevice);
        }
        self.all_reduce.set_device(reducer);
        Ok(self)
    }

    /// The model as it stands (after the last update).
    pub fn model(&self) -> &M {
        self.model.as_ref().expect("the model is always put back")
    }

    /// The model, leaving the replica.
    pub fn into_model(mut self) -> M {
        self.model.take().expect("the model is always put back")
    }

    /// The options it was built with.
    pub fn options(&self) -> &ReplicaOptions {
        &self.options
    }

    /// The collective it trains through.
    pub fn comm(&self) -> &'c dyn Collective {
        self.comm
    }

    /// Optimizer steps applied so far (restored by [`load`](Self::load)).
    pub fn steps(&self) -> u64 {
        self.placement.steps()
    }

    /// The dotted names of the float parameters, in module order.
    pub fn parameter_names(&self) -> &[String] {
        &self.names
    }

    /// The peak learning rate after scaling by the world size.
    pub fn peak_lr(&self) -> f64 {
        self.options.lr_scaling.scale(self.options.lr, self.comm.world_size())
    }

    /// The learning rate the next update will use.
    pub fn next_lr(&self) -> f64 {
        self.options.schedule.lr(self.peak_lr(), self.steps())
    }

    /// Writes a checkpoint of the replica (parameters, AdamW moments, step)
    /// with the caller's `state` (any JSON object: where its loop stands) and
    /// `extra` files, under `root` (see [`checkpoint`]): all ranks meet at a
    /// barrier, then the root rank of the broadcast (rank 0 by default) writes,
    /// atomically, keeping the newest `keep`. Returns the folder on the rank
    /// that wrote it.
    pub fn save<S: serde::Serialize>(
        &self,
        root: &Path,
        state: &S,
        extra: &[(String, Vec<u8>)],
        keep: usize,
    ) -> Result<Option<PathBuf>, TrainError> {
        self.comm.barrier("checkpoint")?;
        if self.comm.rank() != self.options.root {
            return Ok(None);
        }
        let (params, optim) = self.placement.host_state(self.model())?;
        let dir = checkpoint::save(root, &params, &optim, state, extra, keep)?;
        Ok(Some(dir))
    }

    /// Writes a checkpoint as [`Replica::save`] does, from this rank alone,
    /// without meeting the others: for a member whose world is gone (an
    /// elastic run below its minimum), so the run can be resumed.
    pub fn save_alone<S: serde::Serialize>(
        &self,
        root: &Path,
        state: &S,
        keep: usize,
    ) -> Result<PathBuf, TrainError> {
        let (params, optim) = self.placement.host_state(self.model())?;
        Ok(checkpoint::save(root, &params, &optim, state, &[], keep)?)
    }

    /// Resumes from the checkpoint in `dir`: every rank reads it (so `dir` must
    /// be a folder every rank sees), then the ranks compare what they loaded
    /// (a fingerprint of parameters, moments and step) and all fail together,
    /// naming the ranks, if any could not load it or holds something else.
    /// Returns the caller's state saved with it.
    pub fn load(&mut self, dir: &Path) -> Result<serde_json::Value, TrainError> {
        let loaded = self.read_checkpoint(dir);
        let (status, print) = match &loaded {
            Ok((params, optim, _)) => (0i64, fingerprint(params, optim)),
            Err(_) => (1, 0),
        };
        let mine = [status, print as i64, self.comm.rank() as i64];
        let gathered = self.comm.all_gather("checkpoint.fingerprint", &[3], i64::tensor_ref(&mine))?;
        let Buffer::I64(all) = gathered.data else { unreachable!("gathered i64") };
        let (params, optim, state) = loaded?;
        let failed: Vec<usize> =
            all.chunks(3).enumerate().filter(|(_, c)| c[0] != 0).map(|(r, _)| r).collect();
        if !failed.is_empty() {
            return Err(TrainError::Disagree(format!(
                "{}: rank(s) {failed:?} could not load it (see their logs)",
                dir.display()
            )));
        }
        let odd: Vec<usize> =
            all.chunks(3).enumerate().filter(|(_, c)| c[1] != all[1]).map(|(r, _)| r).collect();
        if !odd.is_empty() {
            return Err(TrainError::Disagree(format!(
                "{}: rank(s) {odd:?} loaded other parameters or optimizer state than rank 0 \
                 (fingerprints {:?}); do all ranks see the same folder?",
                dir.display(),
                all.chunks(3).map(|c| format!("{:016x}", c[1] as u64)).collect::<Vec<_>>()
            )));
        }
        let model = self.model.take().expect("the model is always put back");
        self.model = Some(params.write(model, &self.device));
        self.placement.reset(Reset::State(params, optim));
        self.pending = None;
        (self.passes, self.local_loss, self.compute) = (0, 0.0, Duration::ZERO);
        self.deferred_loss.clear();
        (self.exposed, self.communication, self.overlap.local) = (Duration::ZERO, Duration::ZERO, None);
        Ok(state)
    }

    fn read_checkpoint(&self, dir: &Path) -> Result<(FlatParams, FlatAdamW, serde_json::Value), TrainError> {
        let n = self.names.len();
        let mut params = FlatParams {
            names: self.names.clone(),
            shapes: self.shapes.clone(),
            values: vec![Vec::new(); n],
        };
        let decay: Vec<bool> = self.names.iter().map(|n| decays(n, &self.options.no_decay)).collect();
        let mut optim = FlatAdamW {
            settings: self.options.adamw,
            step: 0,
            m: vec![Vec::new(); n],
            v: vec![Vec::new(); n],
            decay,
        };
        let loaded = checkpoint::load(dir, &mut params, &mut optim)?;
        Ok((params, optim, loaded.state))
    }
}

/// A 64-bit fingerprint of parameters, moments and step (FNV-1a over the bits
/// of each buffer, the buffers' hashes combined in order).
fn fingerprint(params: &FlatParams, optim: &FlatAdamW) -> u64 {
    use rayon::prelude::*;
    let buffers: Vec<&[f32]> =
        params.values.iter().chain(&optim.m).chain(&optim.v).map(Vec::as_slice).collect();
    let hashes: Vec<u64> = buffers
        .par_iter()
        .map(|b| {
            b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
                (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3)
            })
        })
        .collect();
    hashes
        .iter()
        .chain(std::iter::once(&optim.step))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x).wrapping_mul(0x100_0000_01b3))
}

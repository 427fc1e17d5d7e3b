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

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Tensor};
use drove_collective::fusion::FusionOptions;
use drove_collective::{Buffer, Collective, Element, Gathered, ReduceOptions};

use crate::TrainError;
use crate::checkpoint;

mod resync;
use crate::device::BucketAllReduce;
use crate::flat::{AdamWSettings, FlatAdamW, FlatParams, NO_DECAY, decays};
use crate::micro::{MicroBatches, fresh_leaves};
use crate::placement::{Placement, PlacementStep, Start, UpdateSettings};
use crate::schedule::{LrScaling, Schedule};
use crate::timeline::{Timeline, Track};
pub use resync::Resynced;

/// The timeline of a replica that records none.
static OFF: std::sync::LazyLock<Timeline> = std::sync::LazyLock::new(Timeline::off);

/// What the loss closure returns, and so how micro-batches and backward passes
/// add up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LossReduction {
    /// The mean over the micro-batch's rows (burn's `Reduction::Mean`). The
    /// replica weights it by the micro-batch's share of the step's rows on this
    /// rank, `rows / (batch rows x backward_passes_per_step)`, so the summed
    /// gradient is that of the mean over the whole step.
    #[default]
    Mean,
    /// Used as it is: micro-batches and passes add up. For losses the caller
    /// normalises itself (the NER trainer divides by the labelled tokens of the
    /// global batch).
    Sum,
}

/// How a [`Replica`] trains. Every rank must use the same options.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaOptions {
    /// Peak learning rate for one rank, before [`lr_scaling`](Self::lr_scaling).
    pub lr: f64,
    /// How the rate grows with the world size (Horovod: linearly).
    pub lr_scaling: LrScaling,
    /// The rate over the run.
    pub schedule: Schedule,
    /// AdamW's betas, epsilon and decoupled weight decay.
    pub adamw: AdamWSettings,
    /// Parameters that take no weight decay: dotted names matched against
    /// these patterns by [`decays`], where `*` stands for any run of
    /// characters. The default, [`NO_DECAY`] (`["*bias", "*norm.*"]`), leaves
    /// out biases and LayerNorm parameters, as transformers' `Trainer` does.
    pub no_decay: Vec<String>,
    /// Clip the averaged gradients to this global L2 norm (0: no clipping).
    pub clip_norm: f64,
    /// Split each batch into this many micro-batches run at once, each on a
    /// thread pool of its own (0: one per thread of the global rayon pool).
    pub micro_batches: usize,
    /// Sum the gradients of this many [`Replica::step`] calls before one
    /// all-reduce and update (gradient accumulation, as Horovod's).
    pub backward_passes_per_step: usize,
    /// What the loss closure returns.
    pub loss: LossReduction,
    /// Bucket size and wire compression of the gradient all-reduce.
    pub fusion: FusionOptions,
    /// Where parameters and optimizer state live.
    pub placement: Placement,
    /// The rank whose parameters every rank starts from.
    pub root: usize,
}

impl Default for ReplicaOptions {
    fn default() -> Self {
        ReplicaOptions {
            lr: 1e-3,
            lr_scaling: LrScaling::Linear,
            schedule: Schedule::Constant,
            adamw: AdamWSettings::default(),
            no_decay: NO_DECAY.map(String::from).to_vec(),
            clip_norm: 0.0,
            micro_batches: 0,
            backward_passes_per_step: 1,
            loss: LossReduction::Mean,
            fusion: FusionOptions::default(),
            placement: Placement::Host,
            root: 0,
        }
    }
}

impl ReplicaOptions {
    fn check(&self, world: usize) -> Result<(), TrainError> {
        let bad = |field: &str, rule: &str, value: f64| {
            Err(TrainError::Options(format!("{field} must be {rule}, found {value}")))
        };
        let a = &self.adamw;
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad("lr", "a finite number >= 0", self.lr);
        }
        if !(self.clip_norm.is_finite() && self.clip_norm >= 0.0) {
            return bad("clip_norm", "a finite number >= 0 (0: no clipping)", self.clip_norm);
        }
        for (field, value) in [("adamw.beta1", a.beta1), ("adamw.beta2", a.beta2)] {
            if !(0.0..1.0).contains(&value) {
                return bad(field, "in [0, 1)", value);
            }
        }
        if !(a.epsilon.is_finite() && a.epsilon > 0.0) {
            return bad("adamw.epsilon", "a finite number > 0", a.epsilon);
        }
        if !(a.weight_decay.is_finite() && a.weight_decay >= 0.0) {
            return bad("adamw.weight_decay", "a finite number >= 0", a.weight_decay);
        }
        if self.backward_passes_per_step == 0 {
            return Err(TrainError::Options("backward_passes_per_step must be at least 1, found 0".into()));
        }
        if self.root >= world {
            return Err(TrainError::Options(format!(
                "root must be a rank of the world of {world}, found {}",
                self.root
            )));
        }
        Ok(())
    }
}

/// A batch a replica can split by rows into micro-batches.
pub trait Rows: Sync {
    /// Rows (examples) in the batch.
    fn rows(&self) -> usize;
}

impl<T: Sync> Rows for [T] {
    fn rows(&self) -> usize {
        self.len()
    }
}

impl<T: Sync> Rows for Vec<T> {
    fn rows(&self) -> usize {
        self.len()
    }
}

/// One micro-batch, as the loss closure sees it.
#[derive(Debug)]
pub struct Micro<'a, T: ?Sized> {
    /// The whole batch passed to [`Replica::step`].
    pub batch: &'a T,
    /// The rows of `batch` this micro-batch covers.
    pub rows: Range<usize>,
    /// Which micro-batch (0-based).
    pub index: usize,
    /// The factor the replica applies to the closure's loss (see
    /// [`LossReduction`]).
    pub weight: f64,
}

/// The time a step spent in each phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct PhaseTimes {
    /// Forward and backward passes (all micro-batches and passes of the step).
    pub compute: Duration,
    /// The gradient all-reduce.
    pub all_reduce: Duration,
    /// The global norm and clipping.
    pub clip: Duration,
    /// The optimizer update and writing the parameters back.
    pub update: Duration,
}

/// What one [`Replica::step`] call did.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepOutcome {
    /// Whether this call ended a step (all-reduce and update); false while
    /// gradients are being accumulated.
    pub applied: bool,
    /// Optimizer steps applied so far.
    pub step: u64,
    /// Backward passes accumulated towards the current (or just applied) step.
    pub passes: usize,
    /// This rank's loss over the step so far: the weighted sum of its
    /// micro-batches' losses over the accumulated passes.
    pub local_loss: f64,
    /// The mean of the ranks' local losses (when applied).
    pub global_loss: Option<f64>,
    /// The global norm of the averaged gradients before clipping (when applied).
    pub grad_norm: Option<f64>,
    /// The learning rate of the update (when applied).
    pub lr: Option<f64>,
    /// Time spent in each phase.
    pub times: PhaseTimes,
}

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
    /// Parameters, optimizer state and the gradients summed over this
    /// step's passes so far, where `options.placement` says.
    placement: Box<dyn PlacementStep<B, M>>,
    micro: MicroBatches,
    passes: usize,
    local_loss: f64,
    compute: Duration,
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
        crate::broadcast_flat(&mut params, comm, options.root)?;
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
        )
        .map_err(|e| TrainError::Options(format!("could not start the micro-batch threads: {e}")))?;
        let (names, shapes) = (params.names.clone(), params.shapes.clone());
        let start = Start { params, adamw: options.adamw, decay, fusion: options.fusion, device };
        let placement = options.placement.start(start);
        Ok(Replica {
            model: Some(model),
            comm,
            options,
            device: device.clone(),
            names,
            shapes,
            placement,
            micro,
            passes: 0,
            local_loss: 0.0,
            compute: Duration::ZERO,
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
    /// # Errors
    /// On a host-placed replica, which has no buckets on the device.
    pub fn with_bucket_all_reduce(
        mut self,
        reducer: Box<dyn BucketAllReduce<B::InnerBackend>>,
    ) -> Result<Self, TrainError> {
        self.placement.set_bucket_all_reduce(reducer)?;
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

    /// One backward pass over this rank's `batch` and, every
    /// `backward_passes_per_step` calls, the update: gradients averaged across
    /// ranks, clipped, and applied by AdamW. Every rank calls it as often.
    ///
    /// `loss(model, micro)` returns the loss of the rows `micro.rows` of
    /// `micro.batch`, as [`ReplicaOptions::loss`] says; it runs once per
    /// micro-batch, at once on several threads.
    pub fn step<T, F>(&mut self, batch: &T, loss: F) -> Result<StepOutcome, TrainError>
    where
        T: Rows + ?Sized,
        F: Fn(&M, &Micro<'_, T>) -> Tensor<B, 1> + Sync,
    {
        let local = self.backward(batch, loss)?;
        if self.passes < self.options.backward_passes_per_step {
            return Ok(StepOutcome {
                applied: false,
                step: self.steps(),
                passes: self.passes,
                local_loss: local,
                global_loss: None,
                grad_norm: None,
                lr: None,
                times: PhaseTimes { compute: self.compute, ..PhaseTimes::default() },
            });
        }
        self.apply()
    }

    /// One backward pass: the micro-batches' gradients are added to those
    /// accumulated since the last update. Returns this rank's loss over the
    /// step so far. [`step`](Self::step) is this followed, when due, by
    /// [`apply`](Self::apply).
    pub fn backward<T, F>(&mut self, batch: &T, loss: F) -> Result<f64, TrainError>
    where
        T: Rows + ?Sized,
        F: Fn(&M, &Micro<'_, T>) -> Tensor<B, 1> + Sync,
    {
        let started = Instant::now();
        let rows = batch.rows();
        if rows == 0 {
            return Err(TrainError::Options("a step needs a batch of at least one row".into()));
        }
        let model = self.model();
        let passes = self.options.backward_passes_per_step as f64;
        let reduction = self.options.loss;
        let jobs: Vec<_> = split_rows(rows, self.micro.count())
            .into_iter()
            .map(|range| (range, fresh_leaves(model.clone())))
            .collect();
        let timeline = self.timeline;
        let pass = |index: usize, range: Range<usize>, model: &M| {
            let weight = match reduction {
                LossReduction::Mean => range.len() as f64 / rows as f64 / passes,
                LossReduction::Sum => 1.0,
            };
            let micro = Micro { batch, rows: range, index, weight };
            let forward = Instant::now();
            let mut value = loss(model, &micro);
            if reduction == LossReduction::Mean {
                value = value.mul_scalar(weight);
            }
            let scalar = f64::from(value.clone().into_scalar().elem::<f32>());
            timeline.record("forward", "micro", Track::Micro(index), forward);
            let backward = Instant::now();
            let grads = GradientsParams::from_grads(value.backward(), model);
            timeline.record("backward", "micro", Track::Micro(index), backward);
            (scalar, grads)
        };
        let total = self.placement.backward(&self.micro, jobs, &pass)?;
        self.passes += 1;
        self.local_loss += total;
        self.compute += started.elapsed();
        Ok(self.local_loss)
    }

    /// This rank's accumulated gradient of parameter `index` (module order),
    /// before the all-reduce: for diagnostics such as the gradient cosine
    /// between ranks.
    pub fn local_gradient(&self, index: usize) -> Result<Vec<f32>, TrainError> {
        let missing =
            || TrainError::Options(format!("no gradient {index}: no backward pass since the last update"));
        self.placement.local_gradient(index).ok_or_else(missing)?
    }

    /// The update of the passes accumulated so far: gradients averaged across
    /// ranks, clipped by their global norm, and applied by AdamW. Every rank
    /// calls it at the same step.
    pub fn apply(&mut self) -> Result<StepOutcome, TrainError> {
        if !self.placement.has_gradients() {
            return Err(TrainError::Options("apply needs a backward pass first".into()));
        }
        let (comm, fusion, clip) = (self.comm, self.options.fusion, self.options.clip_norm);
        let lr = self.next_lr();
        let mut times = PhaseTimes { compute: std::mem::take(&mut self.compute), ..PhaseTimes::default() };
        let local_loss = std::mem::take(&mut self.local_loss);
        let passes = std::mem::take(&mut self.passes);
        let step = self.steps() + 1;
        // The loss first: a rank whose loss is not finite stops every rank
        // before any update, so the parameters stay those of the last step.
        let global_loss = match self.global_loss(local_loss) {
            Ok(loss) if loss.is_finite() => loss,
            other => {
                self.placement.discard_gradients();
                let loss = other?;
                return Err(self.non_finite(step, "loss", loss, local_loss));
            }
        };
        let settings = UpdateSettings { comm, fusion, clip, lr, timeline: self.timeline };
        let model = self.model.take().expect("the model is always put back");
        let (model, grad_norm) = self.placement.update(model, &settings, &mut times);
        self.model = Some(model);
        let grad_norm = match grad_norm {
            Ok(norm) if !norm.is_finite() => {
                return Err(self.non_finite(step, "global gradient norm", norm, local_loss));
            }
            other => other?,
        };
        Ok(StepOutcome {
            applied: true,
            step: self.steps(),
            passes,
            local_loss,
            global_loss: Some(global_loss),
            grad_norm: Some(grad_norm),
            lr: Some(lr),
            times,
        })
    }

    /// The mean of the ranks' local losses (one scalar all-reduce).
    fn global_loss(&self, local_loss: f64) -> Result<f64, TrainError> {
        if self.comm.world_size() == 1 {
            return Ok(local_loss);
        }
        let mut value = [local_loss];
        let started = Instant::now();
        let reduced =
            self.comm.all_reduce("step.loss", &[1], f64::tensor_mut(&mut value), ReduceOptions::average());
        self.timeline.record("loss all-reduce", "phase", Track::Main, started);
        reduced?;
        Ok(value[0])
    }

    /// The error of a step whose loss or gradient norm is not finite, naming
    /// the ranks whose local loss was not (every rank gathers them, so all fail
    /// with the same message).
    fn non_finite(&self, step: u64, what: &'static str, value: f64, local_loss: f64) -> TrainError {
        let ranks = if self.comm.world_size() > 1 {
            match self.comm.all_gather("step.nonfinite", &[1], f64::tensor_ref(&[local_loss])) {
                Ok(Gathered { data: Buffer::F64(losses), .. }) => {
                    losses.iter().enumerate().filter(|(_, l)| !l.is_finite()).map(|(r, _)| r).collect()
                }
                Ok(_) => Vec::new(),
                Err(e) => return e.into(),
            }
        } else if local_loss.is_finite() {
            Vec::new()
        } else {
            vec![0]
        };
        TrainError::NonFinite { step, what, value, ranks }
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
        self.placement.restore(params, optim);
        (self.passes, self.local_loss, self.compute) = (0, 0.0, Duration::ZERO);
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

/// Splits `rows` into at most `parts` contiguous ranges of near-equal size (the
/// first ones one row larger), leaving out empty ones (the split
/// `drove-collate`'s `Batch::split` makes too).
pub fn split_rows(rows: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, rows.max(1));
    let (base, extra) = (rows / parts, rows % parts);
    let mut start = 0;
    let mut out = Vec::with_capacity(parts);
    for p in 0..parts {
        let len = base + usize::from(p < extra);
        if len > 0 {
            out.push(start..start + len);
        }
        start += len;
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_as_the_collator_splits_batches() {
        assert_eq!(split_rows(16, 3), vec![0..6, 6..11, 11..16]);
        assert_eq!(split_rows(2, 4), vec![0..1, 1..2]);
        assert_eq!(split_rows(5, 1), vec![0..5]);
    }

    #[test]
    fn no_decay_patterns_match_biases_and_layer_norms() {
        let o = ReplicaOptions::default();
        assert!(decays("bert.layers.0.query.weight", &o.no_decay));
        assert!(!decays("bert.layers.0.query.bias", &o.no_decay));
        assert!(!decays("bert.layers.0.attention_norm.gamma", &o.no_decay));
        assert!(!decays("bert.embeddings.norm.beta", &o.no_decay));
    }

    #[test]
    fn options_name_the_field_at_fault() {
        let check = |o: ReplicaOptions| o.check(2).unwrap_err().to_string();
        assert!(check(ReplicaOptions { lr: f64::NAN, ..Default::default() }).contains("lr must be"));
        assert!(check(ReplicaOptions { clip_norm: -1.0, ..Default::default() }).contains("clip_norm"));
        assert!(
            check(ReplicaOptions { backward_passes_per_step: 0, ..Default::default() }).contains("backward")
        );
        assert!(check(ReplicaOptions { root: 2, ..Default::default() }).contains("root"));
        let adamw = AdamWSettings { beta1: 1.0, ..Default::default() };
        assert!(check(ReplicaOptions { adamw, ..Default::default() }).contains("adamw.beta1"));
    }
}

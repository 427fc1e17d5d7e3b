//! Where a [`Replica`](crate::Replica) keeps its parameters, gradients and
//! optimizer state, and that placement's part of a step.
//!
//! The user picks a [`Placement`] in the options; the replica then holds one
//! [`PlacementStep`], the host's ([`host`]: flat buffers, the CPU fast path) or
//! the backend's ([`backend`]: tensors on the device). Each owns its
//! optimizer state and the gradients summed since the last update, in its own
//! type, so the gradients of one placement can never reach the other's update.
//! The replica runs the forward and backward passes and the loss all-reduce;
//! a placement takes each pass's gradients, sums them, and makes the update
//! (gradient all-reduce, clipping, AdamW).

mod backend;
mod host;

use std::borrow::Cow;
use std::ops::Range;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use drove_collective::Collective;
use drove_collective::fusion::FusionOptions;

use crate::TrainError;
use crate::device::{BucketAllReduce, DeviceAdamW, HostStaging};
use crate::flat::{AdamWSettings, FlatAdamW, FlatParams};
use crate::micro::MicroBatches;
use crate::replica::PhaseTimes;
use crate::timeline::{Timeline, Track};

pub(crate) use backend::BackendPlacement;
pub(crate) use host::HostPlacement;

/// Where a replica keeps its parameters, gradients and optimizer state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Flat `f32` buffers in host memory, updated by [`FlatAdamW`] on rayon's
    /// threads: the CPU fast path. The model's tensors are rewritten from the
    /// buffers after every update.
    #[default]
    Host,
    /// Tensors on the backend's device, updated by the same AdamW in burn ops
    /// ([`DeviceAdamW`]); gradients cross to the host only inside the bucket
    /// all-reduce ([`BucketAllReduce`]), which a device collective replaces.
    Backend,
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(Placement::Host),
            "backend" | "device" => Ok(Placement::Backend),
            other => Err(format!("unknown placement {other:?}: expected host or backend")),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Placement::Host => "host",
            Placement::Backend => "backend",
        })
    }
}

/// What a fresh placement starts from.
pub(crate) struct Start<'a, B: AutodiffBackend> {
    /// The (broadcast) parameters.
    pub params: FlatParams,
    /// AdamW's settings.
    pub adamw: AdamWSettings,
    /// Whether each parameter decays.
    pub decay: Vec<bool>,
    /// The wire format of the default bucket all-reduce.
    pub fusion: FusionOptions,
    /// Where the model lives.
    pub device: &'a B::Device,
}

impl Placement {
    /// The placement's state for a model whose parameters are `start.params`.
    pub(crate) fn start<B, M>(self, start: Start<'_, B>) -> Box<dyn PlacementStep<B, M>>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B>,
    {
        match self {
            Placement::Host => {
                let mut optim = FlatAdamW::new(start.adamw, &start.params);
                optim.decay = start.decay;
                Box::new(HostPlacement::<B>::new(start.params, optim, start.device))
            }
            Placement::Backend => {
                let optim = DeviceAdamW::new(start.adamw, &start.params.shapes, start.decay, start.device);
                let reducer = Box::new(HostStaging { compression: start.fusion.compression });
                Box::new(BackendPlacement::<B>::new(optim, reducer, start.device))
            }
        }
    }
}

/// One micro-batch's forward and backward pass, as the replica runs it:
/// `(index, rows, model)` to the loss value and the gradients.
pub(crate) type Pass<'a, M> = dyn Fn(usize, Range<usize>, &M) -> (f64, GradientsParams) + Sync + 'a;

/// What an update needs besides the state it changes.
pub(crate) struct UpdateSettings<'a> {
    /// The collective the gradients are averaged through.
    pub comm: &'a dyn Collective,
    /// Bucket size and wire compression of the gradient all-reduce.
    pub fusion: FusionOptions,
    /// The global norm to clip to (0: no clipping).
    pub clip: f64,
    /// The learning rate of the update.
    pub lr: f64,
    /// Where the phases are recorded.
    pub timeline: &'a Timeline,
}

/// A placement's part of a replica's step; see the [module](self).
pub(crate) trait PlacementStep<B: AutodiffBackend, M: AutodiffModule<B>> {
    /// Runs `pass` on every job at once (one micro-batch each, see
    /// [`MicroBatches::run`]), takes each micro-batch's gradients on its own
    /// thread, and adds them to those pending; returns the sum of the
    /// micro-batches' losses.
    fn backward(
        &mut self,
        micro: &MicroBatches,
        jobs: Vec<(Range<usize>, M)>,
        pass: &Pass<'_, M>,
    ) -> Result<f64, TrainError>;

    /// Whether gradients are pending (a backward pass since the last update).
    fn has_gradients(&self) -> bool;

    /// Drops the pending gradients (a step that ends without an update).
    fn discard_gradients(&mut self);

    /// The pending gradient of parameter `index` (module order), if any.
    fn local_gradient(&self, index: usize) -> Option<Result<Vec<f32>, TrainError>>;

    /// The update from the pending gradients: averaged across ranks, clipped,
    /// and applied by AdamW; returns the model (unchanged if the all-reduce
    /// failed) and the norm before clipping. The gradients are used up.
    fn update(
        &mut self,
        model: M,
        u: &UpdateSettings<'_>,
        times: &mut PhaseTimes,
    ) -> (M, Result<f64, TrainError>);

    /// Optimizer steps applied so far.
    fn steps(&self) -> u64;

    /// Parameters and optimizer state as host buffers, for a checkpoint.
    fn host_state(&self, model: &M) -> Result<(Cow<'_, FlatParams>, Cow<'_, FlatAdamW>), TrainError>;

    /// Takes the parameters and optimizer state of a checkpoint (the model
    /// has been given `params` already); pending gradients are dropped.
    fn restore(&mut self, params: FlatParams, optim: FlatAdamW);

    /// Replaces the bucket all-reduce of the gradients (the backend
    /// placement's seam); an error on a placement that has none.
    fn set_bucket_all_reduce(
        &mut self,
        reducer: Box<dyn BucketAllReduce<B::InnerBackend>>,
    ) -> Result<(), TrainError>;
}

/// The loop both placements' [`PlacementStep::backward`] share: runs `pass`
/// on every job at once, turns each micro-batch's gradients into the
/// placement's own with `take` (on the micro-batch's thread), and adds them to
/// `pending` with `add`, in job order. Returns the sum of the losses.
pub(crate) fn accumulate<M, G>(
    micro: &MicroBatches,
    jobs: Vec<(Range<usize>, M)>,
    pass: &Pass<'_, M>,
    take: impl Fn(&M, &mut GradientsParams) -> Result<G, TrainError> + Sync,
    add: impl Fn(&mut G, G),
    pending: &mut Option<G>,
) -> Result<f64, TrainError>
where
    M: Send,
    G: Send,
{
    let outputs = micro.run(jobs, |index, (range, model)| {
        let (scalar, mut grads) = pass(index, range, &model);
        take(&model, &mut grads).map(|g| (scalar, g))
    });
    let mut total = 0.0;
    for output in outputs {
        let (value, grads) = output?;
        total += value;
        match pending {
            Some(sum) => add(sum, grads),
            None => *pending = Some(grads),
        }
    }
    Ok(total)
}

/// Runs `f`, adding the time it took to `slot` and recording it on the
/// timeline's main track as phase `name`.
pub(crate) fn phase<T>(timeline: &Timeline, name: &str, slot: &mut Duration, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    *slot += started.elapsed();
    timeline.record(name, "phase", Track::Main, started);
    out
}

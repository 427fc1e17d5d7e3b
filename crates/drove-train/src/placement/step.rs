//! What a placement does in a step ([`PlacementStep`]), what an update needs
//! ([`UpdateSettings`]), and the loop of backward passes both placements share
//! ([`accumulate`]).

use std::borrow::Cow;
use std::ops::Range;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use drove_collective::Collective;
use drove_collective::fusion::{FusionOptions, Plan};

use crate::TrainError;
use crate::flat::{FlatAdamW, FlatParams};
use crate::micro::MicroBatches;
use crate::phase::PhaseTimes;
use crate::timeline::Timeline;
use drove_device::BucketAllReduce;

/// One micro-batch's forward and backward pass, as the replica runs it:
/// `(index, rows, model)` to the loss value and the gradients.
pub(crate) type Pass<'a, M> = dyn Fn(usize, Range<usize>, &M) -> (f64, GradientsParams) + Sync + 'a;

/// What an update read back from the device.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Updated {
    /// The global norm of the averaged gradients before clipping.
    pub grad_norm: f64,
    /// The step's losses, where they guarded the update (read with the norm).
    pub loss: Option<Vec<f32>>,
}

/// What an update needs besides the state it changes.
pub(crate) struct UpdateSettings<'a> {
    /// The collective the gradients are averaged through.
    pub comm: &'a dyn Collective,
    /// Bucket size and wire compression of the gradient all-reduce.
    pub fusion: FusionOptions,
    /// Its buckets, row-sparse tables apart (for reductions on the host).
    pub plan: &'a Plan,
    /// The global norm to clip to (0: no clipping).
    pub clip: f64,
    /// The learning rate of the update.
    pub lr: f64,
    /// Where the phases are recorded.
    pub timeline: &'a Timeline,
}

/// A placement's part of a replica's step; see the [module](super).
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
    /// failed) and what was read back. The gradients are used up.
    ///
    /// With `loss` (the step's loss, still on the device) the update is
    /// guarded by it: when the loss or the gradient norm is not finite the
    /// parameters and optimizer state keep their values, and both are read
    /// back together, after the update is queued (the backend placement's
    /// one blocking read of a step).
    fn update(
        &mut self,
        model: M,
        u: &UpdateSettings<'_>,
        times: &mut PhaseTimes,
        loss: Option<Tensor<B::InnerBackend, 1>>,
    ) -> (M, Result<Updated, TrainError>);

    /// Whether an overlapped pass can hand this placement its gradients
    /// (averaged on the host): the host placement, and the backend one with
    /// host staging.
    fn overlappable(&self) -> bool;

    /// Takes the gradients pending from the step's earlier passes as host
    /// buffers (module order), for an overlapped last pass to add to.
    fn take_pending_host(&mut self) -> Result<Option<Vec<Vec<f32>>>, TrainError>;

    /// Takes gradients already summed and averaged across ranks (by an
    /// overlapped pass): the next update skips its all-reduce.
    fn set_reduced(&mut self, grads: Vec<Vec<f32>>) -> Result<(), TrainError>;

    /// Whether the pending gradients are averaged already.
    fn is_reduced(&self) -> bool;

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

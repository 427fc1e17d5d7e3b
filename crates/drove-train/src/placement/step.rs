//! What a placement does in a step ([`PlacementStep`]), the gradients an
//! update takes ([`Gradients`]) and what else it needs ([`UpdateSettings`]),
//! and the loop of backward passes both placements share ([`accumulate`]).

use std::borrow::Cow;
use std::ops::Range;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::TrainError;
use crate::flat::{FlatAdamW, FlatParams};
use crate::gradients::GradientAllReduce;
use crate::micro::MicroBatches;
use crate::phase::PhaseTimes;
use crate::timeline::Timeline;

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

/// The gradients an update takes.
pub(crate) enum Gradients {
    /// Those the placement's backward passes summed on this rank: the update
    /// averages them across ranks first.
    Local,
    /// Summed and averaged across ranks already (by an overlapped pass, as
    /// host buffers, module order): the update takes them as they are. The
    /// placement's own are used up.
    Averaged(Vec<Vec<f32>>),
}

/// What a placement's state is reset to ([`PlacementStep::reset`]).
pub(crate) enum Reset {
    /// Only the pending gradients go (a step that ends without an update).
    Gradients,
    /// The parameters and optimizer state of a checkpoint (the model has been
    /// given the parameters already); the pending gradients go too.
    State(FlatParams, FlatAdamW),
}

/// What an update needs besides the state it changes.
pub(crate) struct UpdateSettings<'a, 'c, I: Backend> {
    /// The door the gradients are averaged through.
    pub all_reduce: &'a GradientAllReduce<'c, I>,
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

    /// The pending gradient of parameter `index` (module order), if any.
    fn local_gradient(&self, index: usize) -> Option<Result<Vec<f32>, TrainError>>;

    /// Takes the pending gradients as host buffers (module order), for an
    /// overlapped last pass to add to; `None` when there are none.
    fn take_host(&mut self) -> Result<Option<Vec<Vec<f32>>>, TrainError>;

    /// The update from `grads`: averaged across ranks through
    /// `u.all_reduce` unless they are already, clipped, and applied by AdamW;
    /// returns the model (unchanged if the all-reduce failed) and what was
    /// read back. The pending gradients are used up.
    ///
    /// With `loss` (the step's loss, still on the device) the update is
    /// guarded by it: when the loss or the gradient norm is not finite the
    /// parameters and optimizer state keep their values, and both are read
    /// back together, after the update is queued (the backend placement's
    /// one blocking read of a step).
    fn update(
        &mut self,
        model: M,
        grads: Gradients,
        u: &UpdateSettings<'_, '_, B::InnerBackend>,
        times: &mut PhaseTimes,
        loss: Option<Tensor<B::InnerBackend, 1>>,
    ) -> (M, Result<Updated, TrainError>);

    /// Drops the pending gradients, and takes a checkpoint's state if given.
    fn reset(&mut self, to: Reset);

    /// Optimizer steps applied so far.
    fn steps(&self) -> u64;

    /// Parameters and optimizer state as host buffers, for a checkpoint.
    fn host_state(&self, model: &M) -> Result<(Cow<'_, FlatParams>, Cow<'_, FlatAdamW>), TrainError>;
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

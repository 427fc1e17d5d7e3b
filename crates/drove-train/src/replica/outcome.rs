//! [`StepOutcome`]: what one [`Replica::step`](crate::Replica::step) call did.

use crate::phase::PhaseTimes;

/// What one [`Replica::step`](crate::Replica::step) call did.
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

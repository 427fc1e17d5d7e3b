//! What the loop tells its caller as it goes: the [`Observer`] and the reports
//! it is given (a step, a re-formed world, a diagnostic comparison).

use drove_diagnostic::AgreementReport;

use crate::EvalReport;

/// One optimiser step, as seen by one rank.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepReport {
    /// Optimiser steps taken so far (this one included).
    pub step: u64,
    /// Total steps of the run.
    pub total_steps: u64,
    /// Epoch.
    pub epoch: usize,
    /// Mean token loss of this rank's batch.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Sentences per second across all ranks, over this step.
    pub sentences_per_s: f64,
    /// Real tokens per second across all ranks, over this step.
    pub tokens_per_s: f64,
    /// Time in each phase of the replica's step. On a GPU a phase ends at its
    /// host sync (compute: each micro-batch's loss value; clip: the norm), so
    /// the update's queued kernels are counted in the next step's compute.
    pub phases: drove_train::PhaseTimes,
    /// The ranks that took the step.
    pub world_size: usize,
    /// The elastic run's generation the step was taken in (0: a fixed world).
    pub generation: u64,
}

/// An elastic run's world re-formed, as one member saw it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReformReport {
    /// The new world's generation.
    pub generation: u64,
    /// This member's rank in it.
    pub rank: usize,
    /// Its size.
    pub world_size: usize,
    /// The step every member is at now (the last one applied before it).
    pub step: u64,
    /// The rank whose state the others took.
    pub source: usize,
    /// The ranks that were behind (new joiners) and took it.
    pub behind: Vec<usize>,
    /// The fingerprint of parameters, moments and step every member holds
    /// now (equal on every member, or the resync failed).
    pub fingerprint: u64,
    /// Why the last world ended.
    pub cause: String,
    /// Seconds from the failure (or the decision to re-form) to the new
    /// world holding one state.
    pub seconds: f64,
}

/// One diagnostic comparison across ranks.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DiagnoseReport {
    /// Step.
    pub step: u64,
    /// The mask comparison over every diagnosed step so far (this one
    /// included): agreement, its expected value and band, the verdict
    /// ([`AgreementReport::is_alarm`], [`AgreementReport::explain`]).
    pub masks: AgreementReport,
    /// Mean over pairs of ranks of the fraction of positions (maskable on both)
    /// where the masks agree.
    pub mask_agreement: f64,
    /// This step's agreement of independent masks, `p^2 + (1-p)^2`.
    pub mask_expected: f64,
    /// The standard deviation of this step's agreement for independent masks
    /// (its 3-sigma band is `mask_expected +- 3 mask_sigma`).
    pub mask_sigma: f64,
    /// Mean over pairs of ranks of the cosine similarity of their local gradients.
    pub grad_cosine: f64,
}

/// What the loop tells its caller as it goes (progress bars, metrics).
pub trait Observer {
    /// Before the first step: steps already done and in total.
    fn started(&mut self, _done: u64, _total: u64) {}
    /// After every step.
    fn step(&mut self, _report: &StepReport) {}
    /// After every evaluation.
    fn evaluated(&mut self, _report: &EvalReport) {}
    /// After every diagnostic comparison.
    fn diagnosed(&mut self, _report: &DiagnoseReport) {}
    /// The diversity alarm, once per run: the first diagnosed step whose masks
    /// are not independent across ranks (identical, or anti-correlated).
    fn alarm(&mut self, _report: &DiagnoseReport) {}
    /// An elastic run's world re-formed and every member holds one state.
    fn reformed(&mut self, _report: &ReformReport) {}
    /// A line worth showing (loading, checkpoints).
    fn note(&mut self, _message: &str) {}
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

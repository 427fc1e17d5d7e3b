//! The outcome of a fine-tune, and the totals it is made of.

use std::path::PathBuf;

use drove_diagnostic::{AgreementAccumulator, AgreementReport};

use crate::EvalReport;

/// The outcome of a fine-tune.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NerSummary {
    /// Ranks.
    pub world_size: usize,
    /// Steps taken in total (including before a resume).
    pub steps: u64,
    /// Evaluations, in order.
    pub evaluations: Vec<EvalReport>,
    /// The last test evaluation's F1, if the test set was evaluated.
    pub test_f1: Option<f64>,
    /// Mask agreement over every diagnosed step of this process, with its
    /// expected value and sigma.
    pub mask_agreement: Option<AgreementReport>,
    /// Mean gradient cosine over the diagnosed steps.
    pub grad_cosine: Option<f64>,
    /// The diversity alarm, if it went off: its step and what it means.
    pub diversity_alarm: Option<String>,
    /// Training sentences per second (all ranks) over this process's steps.
    pub sentences_per_s: f64,
    /// Real tokens per second (all ranks).
    pub tokens_per_s: f64,
    /// Seconds spent in training steps.
    pub train_seconds: f64,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
    /// Each step this process applied: its global loss and gradient norm,
    /// which show the gradient's scale (the parameters after clipping and
    /// AdamW do not), the same at any world size and micro-batch split.
    pub step_scales: Vec<StepScale>,
}

/// What one applied step's gradient was, across all ranks.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepScale {
    /// The optimizer step (1-based).
    pub step: u64,
    /// The global batch's mean token loss.
    pub global_loss: f64,
    /// The global norm of the averaged gradients before clipping.
    pub grad_norm: f64,
}

/// Throughput and diagnostics over this process's steps.
pub(crate) struct Totals {
    pub(crate) agreement: AgreementAccumulator,
    pub(crate) cosines: Vec<f64>,
    pub(crate) alarm: Option<String>,
    pub(crate) step_scales: Vec<StepScale>,
    sentences: u64,
    tokens: u64,
    seconds: f64,
}

impl Totals {
    pub(crate) fn new(world: usize, mask_probability: f64) -> Self {
        Totals {
            agreement: AgreementAccumulator::new(world, mask_probability),
            cosines: Vec::new(),
            alarm: None,
            step_scales: Vec::new(),
            sentences: 0,
            tokens: 0,
            seconds: 0.0,
        }
    }

    pub(crate) fn add(&mut self, seconds: f64, sentences: u64, tokens: u64) {
        self.seconds += seconds;
        self.sentences += sentences;
        self.tokens += tokens;
    }

    pub(crate) fn summary(
        self,
        world: usize,
        steps: u64,
        evaluations: Vec<EvalReport>,
        checkpoint: Option<PathBuf>,
    ) -> NerSummary {
        let per_s = |n: u64| if self.seconds > 0.0 { n as f64 / self.seconds } else { 0.0 };
        let agreement = self.agreement.report();
        NerSummary {
            world_size: world,
            steps,
            test_f1: evaluations.iter().rev().find(|e| e.set == "test").map(|e| e.f1),
            evaluations,
            mask_agreement: (agreement.steps > 0).then_some(agreement),
            grad_cosine: (!self.cosines.is_empty())
                .then(|| self.cosines.iter().sum::<f64>() / self.cosines.len() as f64),
            diversity_alarm: self.alarm,
            sentences_per_s: per_s(self.sentences),
            tokens_per_s: per_s(self.tokens),
            train_seconds: self.seconds,
            checkpoint,
            step_scales: self.step_scales,
        }
    }
}

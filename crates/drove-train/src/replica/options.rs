//! [`ReplicaOptions`], how a [`Replica`](crate::Replica) trains, with the
//! checks [`Replica::new`](crate::Replica::new) makes of them, and
//! [`LossReduction`], what its loss closure returns.

use drove_collective::fusion::FusionOptions;

use crate::TrainError;
use crate::flat::{AdamWSettings, NO_DECAY};
use crate::placement::Placement;
use crate::schedule::{LrScaling, Schedule};
use crate::sparse::SparseRows;

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

/// When the backend placement reads a step's loss back to the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossRead {
    /// Kept on the device until the update. In a world of one rank it
    /// guards the update there (a loss or gradient norm that is not finite
    /// leaves the parameters and optimizer state as they were) and is read
    /// with the gradient norm: one blocking read a step. In a larger world it
    /// is read once backward is queued, before the loss all-reduce that stops
    /// every rank ahead of any update.
    #[default]
    AtUpdate,
    /// Read after each micro-batch's forward pass, before its backward pass
    /// is queued (the device then idles while the host builds backward).
    AfterForward,
}

impl std::str::FromStr for LossRead {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "at-update" => Ok(LossRead::AtUpdate),
            "after-forward" => Ok(LossRead::AfterForward),
            other => Err(format!("expected at-update or after-forward, found {other:?}")),
        }
    }
}

impl std::fmt::Display for LossRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossRead::AtUpdate => "at-update",
            LossRead::AfterForward => "after-forward",
        })
    }
}

/// How a [`Replica`](crate::Replica) trains. Every rank must use the same options.
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
    /// these patterns by [`decays`](crate::flat::decays), where `*` stands for any run of
    /// characters. The default, [`NO_DECAY`] (`["*bias", "*norm.*"]`), leaves
    /// out biases and LayerNorm parameters, as transformers' `Trainer` does.
    pub no_decay: Vec<String>,
    /// Clip the averaged gradients to this global L2 norm (0: no clipping).
    pub clip_norm: f64,
    /// Split each batch into this many micro-batches run at once, each on a
    /// thread pool of its own (0: one per thread of the global rayon pool).
    pub micro_batches: usize,
    /// Sum the gradients of this many [`Replica::step`](crate::Replica::step) calls before one
    /// all-reduce and update (gradient accumulation, as Horovod's).
    pub backward_passes_per_step: usize,
    /// What the loss closure returns.
    pub loss: LossReduction,
    /// Bucket size and wire compression of the gradient all-reduce.
    pub fusion: FusionOptions,
    /// Which parameters (embedding tables) are all-reduced as the rows the
    /// batch touched: on the host collective and host staging (a device
    /// collective all-reduces them dense).
    pub sparse_rows: SparseRows,
    /// Where parameters and optimizer state live.
    pub placement: Placement,
    /// The rank whose parameters every rank starts from.
    pub root: usize,
    /// All-reduce each bucket of gradients while backward goes on (see
    /// [`crate::overlap`]), where it can work: more than one rank, burn's
    /// `Autodiff` backend, host reduction. The same parameters bit for bit
    /// as without it.
    pub overlap: bool,
    /// When the backend placement reads a step's loss (the host placement
    /// reads it after each forward pass: its gradients go through the host).
    pub loss_read: LossRead,
    /// A parameter (its dotted name) whose local gradient, this rank's before
    /// the average, every step keeps for
    /// [`Replica::local_gradient`](crate::Replica::local_gradient), overlapped
    /// or not (an overlapped pass averages the others during backward): for a
    /// diagnostic that compares ranks' gradients. `None`: none is kept past
    /// an overlapped pass.
    pub keep_local_gradient: Option<String>,
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
            sparse_rows: SparseRows::default(),
            placement: Placement::Host,
            root: 0,
            overlap: true,
            loss_read: LossRead::AtUpdate,
            keep_local_gradient: None,
        }
    }
}

impl ReplicaOptions {
    /// Checks the options for a world of `world` ranks, naming the field at fault.
    pub(super) fn check(&self, world: usize) -> Result<(), TrainError> {
        let bad = |field: &'static str, rule: &str, value: f64| {
            Err(TrainError::Options { field, message: format!("must be {rule}, found {value}") })
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
            let message = "must be at least 1, found 0".into();
            return Err(TrainError::Options { field: "backward_passes_per_step", message });
        }
        if self.root >= world {
            let message = format!("must be a rank of the world of {world}, found {}", self.root);
            return Err(TrainError::Options { field: "root", message });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flat::decays;

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

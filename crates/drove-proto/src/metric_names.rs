//! The names of the metrics and the kinds of the events a drove training run
//! records, in one place.
//!
//! A metric's name is the only thing that ties the trainer, which records it,
//! to the readers of the store: `drove report`, which charts it, and the
//! coordinator's Prometheus exporter. They live here, in the contract all of
//! them depend on, so that a rename is one edit and a misspelt name does not
//! compile.
//!
//! ```
//! use drove_proto::metric_names::{self, Score};
//!
//! assert_eq!(metric_names::f1("valid"), "valid_f1");
//! assert_eq!(Score::F1.set_of("valid_f1"), Some("valid"));
//! assert_eq!(Score::Recall.set_of("valid_f1"), None);
//! ```

/// Declares each name as a constant and lists them all in `ALL`, so a reader
/// that needs every name (the Python package's `drove.metric_names`) cannot
/// miss one.
macro_rules! names {
    ($what:literal; $($(#[$doc:meta])* $key:ident = $value:expr;)*) => {
        $($(#[$doc])* pub const $key: &str = $value;)*
        #[doc = concat!("Every ", $what, ": (the constant's name, the name), in declaration order.")]
        pub const ALL: &[(&str, &str)] = &[$((stringify!($key), $key)),*];
    };
}

names! {
    "metric name";
    /// The training loss of a step (the rank's share of the global loss).
    LOSS = "loss";
    /// The learning rate a step was taken at.
    LR = "lr";
    /// The global gradient norm before clipping.
    GRAD_NORM = "grad_norm";
    /// Sentences per second of all ranks.
    SENTENCES_PER_S = "sentences_per_s";
    /// Tokens per second of the rank.
    TOKENS_PER_S = "tokens_per_s";
    /// The epoch a step belongs to.
    EPOCH = "epoch";
    /// The fraction of positions masked alike across ranks (a diagnosed step).
    MASK_AGREEMENT = "mask_agreement";
    /// The agreement independent masks would have.
    MASK_AGREEMENT_EXPECTED = "mask_agreement_expected";
    /// The standard deviation of the agreement of independent masks.
    MASK_AGREEMENT_SIGMA = "mask_agreement_sigma";
    /// The mean cosine between the ranks' local gradients (a diagnosed step).
    GRAD_COSINE = "grad_cosine";
    /// The number of ranks that took a step (an elastic run's world changes).
    WORLD_SIZE = "world_size";
    /// The generation (world) of an elastic run a step was taken in; 0 for a
    /// fixed world.
    GENERATION = "generation";
    /// 1 at a step where the diversity alarm went off (also an [`event`] kind).
    DIVERSITY_ALARM = "diversity_alarm";
}

/// The kinds of a run's events.
pub mod event {
    names! {
        "event kind";
        /// The run's options, a JSON object (rank 0, at step 0).
        OPTIONS = "options";
        /// The masks were found identical (or anti-correlated) across ranks; the
        /// message says why.
        DIVERSITY_ALARM = super::DIVERSITY_ALARM;
        /// An elastic run's world re-formed (rank 0 of the new world, at the
        /// last step applied before it); the message says which generation, its
        /// world size and why.
        REFORM = "reform";
    }
}

/// A score of an evaluation on a named set, recorded as `SET_f1`,
/// `SET_precision` and `SET_recall`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Score {
    /// The entity-level F1.
    F1,
    /// The entity-level precision.
    Precision,
    /// The entity-level recall.
    Recall,
}

impl Score {
    /// Every score, in the order they are shown.
    pub const ALL: [Score; 3] = [Score::F1, Score::Precision, Score::Recall];

    /// What follows the set's name: `_f1`, `_precision`, `_recall`.
    pub fn suffix(self) -> &'static str {
        match self {
            Score::F1 => "_f1",
            Score::Precision => "_precision",
            Score::Recall => "_recall",
        }
    }

    /// The metric's name for the evaluation on `set`.
    pub fn name(self, set: &str) -> String {
        format!("{set}{}", self.suffix())
    }

    /// The set whose score this `name` is, if it is one.
    pub fn set_of(self, name: &str) -> Option<&str> {
        name.strip_suffix(self.suffix())
    }
}

/// `SET_f1`: the entity-level F1 on `set`.
pub fn f1(set: &str) -> String {
    Score::F1.name(set)
}

/// `SET_precision`: the entity-level precision on `set`.
pub fn precision(set: &str) -> String {
    Score::Precision.name(set)
}

/// `SET_recall`: the entity-level recall on `set`.
pub fn recall(set: &str) -> String {
    Score::Recall.name(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_listed_once() {
        assert_eq!(ALL.len(), 13);
        assert!(ALL.contains(&("GENERATION", "generation")));
        assert_eq!(
            event::ALL,
            [("OPTIONS", "options"), ("DIVERSITY_ALARM", "diversity_alarm"), ("REFORM", "reform")]
        );
        let mut names: Vec<&str> = ALL.iter().map(|(_, n)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len(), "two constants share a name");
    }

    #[test]
    fn scores_name_a_set_and_read_it_back() {
        for score in Score::ALL {
            assert_eq!(score.set_of(&score.name("test set")), Some("test set"));
        }
        assert_eq!(precision("valid"), "valid_precision");
        assert_eq!(recall("valid"), "valid_recall");
        assert_eq!(Score::F1.set_of(LOSS), None);
        assert_eq!(event::DIVERSITY_ALARM, DIVERSITY_ALARM);
    }
}

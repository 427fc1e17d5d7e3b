//! The words people read for the states and kinds of the contract: a
//! [`v1::RunState`] (`rendezvous`, `running`, `finished`, `failed`,
//! `metrics-only`), a [`v1::GenerationState`] (`forming`, `running`,
//! `ended`), a [`v1::EndKind`] (`closed-connection`, `heartbeat`, ...) and
//! a query's [`v1::Aggregation`] (`raw`, `mean`, `min`, `max`, `sum`,
//! `count`), in one table each. `drove runs`, `drove metrics --agg`, the
//! report, Prometheus labels and the coordinator's store all show, read or
//! hold these words.
//!
//! Each has `word()` and `from_word()`, is shown as its word
//! ([`Display`](fmt::Display)), and parses from it ([`FromStr`]), a word that
//! is none of them an [`UnknownWord`] naming it.
//!
//! ```
//! use drove_proto::v1::{Aggregation, EndKind, GenerationState, RunState};
//!
//! assert_eq!(RunState::MetricsOnly.word(), "metrics-only");
//! assert_eq!("mean".parse::<Aggregation>(), Ok(Aggregation::Mean));
//! assert_eq!("ended".parse::<GenerationState>(), Ok(GenerationState::Ended));
//! assert_eq!(EndKind::ClosedConnection.to_string(), "closed-connection");
//! let err = "paused".parse::<RunState>().unwrap_err();
//! assert!(err.to_string().starts_with("\"paused\" is not a run state ("), "{err}");
//! ```

use std::fmt;
use std::str::FromStr;

use crate::v1;

/// A word that is none of a table's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownWord {
    /// What the words name, with its article: `a run state`, `an end kind`.
    pub what: &'static str,
    /// The word read.
    pub word: String,
    /// The words it could have been, in order.
    pub words: Vec<&'static str>,
}

impl UnknownWord {
    /// `word` is not `what` (one of `words`).
    pub fn new(what: &'static str, word: &str, words: impl IntoIterator<Item = &'static str>) -> Self {
        UnknownWord { what, word: word.to_string(), words: words.into_iter().collect() }
    }
}

/// `"paused" is not a run state (rendezvous, running, finished or failed)`.
impl fmt::Display for UnknownWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not {} (", self.word, self.what)?;
        for (i, word) in self.words.iter().enumerate() {
            match i {
                0 => {}
                _ if i + 1 == self.words.len() => f.write_str(" or ")?,
                _ => f.write_str(", ")?,
            }
            f.write_str(word)?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for UnknownWord {}

impl v1::RunState {
    /// Every state, in the order of their numbers.
    pub const ALL: [v1::RunState; 6] = [
        v1::RunState::Unspecified,
        v1::RunState::Rendezvous,
        v1::RunState::Running,
        v1::RunState::Finished,
        v1::RunState::Failed,
        v1::RunState::MetricsOnly,
    ];

    /// The word people read (`drove runs`, the report, Prometheus labels) and
    /// the coordinator's store holds: `rendezvous`, `running`, `finished`,
    /// `failed`, `metrics-only` (and `unspecified`).
    pub fn word(self) -> &'static str {
        match self {
            v1::RunState::Unspecified => "unspecified",
            v1::RunState::Rendezvous => "rendezvous",
            v1::RunState::Running => "running",
            v1::RunState::Finished => "finished",
            v1::RunState::Failed => "failed",
            v1::RunState::MetricsOnly => "metrics-only",
        }
    }

    /// The state whose [`word`](Self::word) is `word`, if any.
    pub fn from_word(word: &str) -> Option<v1::RunState> {
        Self::ALL.into_iter().find(|s| s.word() == word)
    }
}

/// The state's [`word`](v1::RunState::word), padded to the width asked for.
impl fmt::Display for v1::RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.word())
    }
}

/// The state whose [`word`](v1::RunState::word) this is.
impl FromStr for v1::RunState {
    type Err = UnknownWord;

    fn from_str(s: &str) -> Result<v1::RunState, UnknownWord> {
        v1::RunState::from_word(s)
            .ok_or_else(|| UnknownWord::new("a run state", s, v1::RunState::ALL.map(v1::RunState::word)))
    }
}

impl v1::GenerationState {
    /// Every state, in the order of their numbers.
    pub const ALL: [v1::GenerationState; 4] = [
        v1::GenerationState::Unspecified,
        v1::GenerationState::Forming,
        v1::GenerationState::Running,
        v1::GenerationState::Ended,
    ];

    /// The word people read (`drove runs`) and the coordinator's store
    /// holds: `forming`, `running`, `ended` (and `unspecified`).
    pub fn word(self) -> &'static str {
        match self {
            v1::GenerationState::Unspecified => "unspecified",
            v1::GenerationState::Forming => "forming",
            v1::GenerationState::Running => "running",
            v1::GenerationState::Ended => "ended",
        }
    }

    /// The state whose [`word`](Self::word) is `word`, if any.
    pub fn from_word(word: &str) -> Option<v1::GenerationState> {
        Self::ALL.into_iter().find(|s| s.word() == word)
    }
}

/// The state's [`word`](v1::GenerationState::word), padded to the width asked for.
impl fmt::Display for v1::GenerationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.word())
    }
}

/// The state whose [`word`](v1::GenerationState::word) this is.
impl FromStr for v1::GenerationState {
    type Err = UnknownWord;

    fn from_str(s: &str) -> Result<v1::GenerationState, UnknownWord> {
        v1::GenerationState::from_word(s).ok_or_else(|| {
            UnknownWord::new("a generation state", s, v1::GenerationState::ALL.map(v1::GenerationState::word))
        })
    }
}

impl v1::EndKind {
    /// Every kind, in the order of their numbers.
    pub const ALL: [v1::EndKind; 7] = [
        v1::EndKind::Unspecified,
        v1::EndKind::ClosedConnection,
        v1::EndKind::CollectiveDeadline,
        v1::EndKind::Heartbeat,
        v1::EndKind::MemberAdded,
        v1::EndKind::Finished,
        v1::EndKind::Failed,
    ];

    /// The word people read (`drove runs`): `closed-connection`,
    /// `collective-deadline`, `heartbeat`, `member-added`, `finished`,
    /// `failed` (and `unspecified`). The coordinator's store holds a kind by
    /// its proto name ([`as_str_name`](Self::as_str_name), `END_KIND_...`).
    pub fn word(self) -> &'static str {
        match self {
            v1::EndKind::Unspecified => "unspecified",
            v1::EndKind::ClosedConnection => "closed-connection",
            v1::EndKind::CollectiveDeadline => "collective-deadline",
            v1::EndKind::Heartbeat => "heartbeat",
            v1::EndKind::MemberAdded => "member-added",
            v1::EndKind::Finished => "finished",
            v1::EndKind::Failed => "failed",
        }
    }

    /// The kind whose [`word`](Self::word) is `word`, if any.
    pub fn from_word(word: &str) -> Option<v1::EndKind> {
        Self::ALL.into_iter().find(|k| k.word() == word)
    }
}

/// The kind's [`word`](v1::EndKind::word), padded to the width asked for.
impl fmt::Display for v1::EndKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.word())
    }
}

/// The kind whose [`word`](v1::EndKind::word) this is.
impl FromStr for v1::EndKind {
    type Err = UnknownWord;

    fn from_str(s: &str) -> Result<v1::EndKind, UnknownWord> {
        v1::EndKind::from_word(s)
            .ok_or_else(|| UnknownWord::new("an end kind", s, v1::EndKind::ALL.map(v1::EndKind::word)))
    }
}

impl v1::Aggregation {
    /// Every aggregation a query names, in the order of their numbers;
    /// `Unspecified` is none of them: on the wire it is
    /// [`Raw`](v1::Aggregation::Raw), and it is shown as `raw`.
    pub const ALL: [v1::Aggregation; 6] = [
        v1::Aggregation::Raw,
        v1::Aggregation::Mean,
        v1::Aggregation::Min,
        v1::Aggregation::Max,
        v1::Aggregation::Sum,
        v1::Aggregation::Count,
    ];

    /// How points of different ranks at one (name, step) combine, in the
    /// word `drove metrics --agg` reads and prints: `raw`, `mean`, `min`,
    /// `max`, `sum`, `count` (`Unspecified` is `raw`).
    pub fn word(self) -> &'static str {
        match self {
            v1::Aggregation::Unspecified | v1::Aggregation::Raw => "raw",
            v1::Aggregation::Mean => "mean",
            v1::Aggregation::Min => "min",
            v1::Aggregation::Max => "max",
            v1::Aggregation::Sum => "sum",
            v1::Aggregation::Count => "count",
        }
    }

    /// The aggregation whose [`word`](Self::word) is `word`, if any (never
    /// `Unspecified`).
    pub fn from_word(word: &str) -> Option<v1::Aggregation> {
        Self::ALL.into_iter().find(|a| a.word() == word)
    }
}

/// The aggregation's [`word`](v1::Aggregation::word), padded to the width asked for.
impl fmt::Display for v1::Aggregation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.word())
    }
}

/// The aggregation whose [`word`](v1::Aggregation::word) this is.
impl FromStr for v1::Aggregation {
    type Err = UnknownWord;

    fn from_str(s: &str) -> Result<v1::Aggregation, UnknownWord> {
        v1::Aggregation::from_word(s).ok_or_else(|| {
            UnknownWord::new("an aggregation", s, v1::Aggregation::ALL.map(v1::Aggregation::word))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{Aggregation, EndKind, GenerationState, RunState};

    #[test]
    fn every_run_state_has_its_own_word_and_reads_back_from_it() {
        for state in RunState::ALL {
            assert_eq!(RunState::from_word(state.word()), Some(state));
            assert_eq!(state.to_string(), state.word());
        }
        assert_eq!(RunState::ALL.map(|s| s as i32), [0, 1, 2, 3, 4, 5]);
        assert_eq!(RunState::from_word("RUNNING"), None);
        assert_eq!(format!("[{:<9}]", RunState::Failed), "[failed   ]");
    }

    #[test]
    fn every_generation_state_and_end_kind_has_its_own_word_and_reads_back_from_it() {
        for state in GenerationState::ALL {
            assert_eq!(state.word().parse(), Ok(state));
            assert_eq!(state.to_string(), state.word());
        }
        assert_eq!(GenerationState::ALL.map(|s| s as i32), [0, 1, 2, 3]);
        for kind in EndKind::ALL {
            assert_eq!(kind.word().parse(), Ok(kind));
            assert_eq!(kind.to_string(), kind.word());
        }
        assert_eq!(EndKind::ALL.map(|k| k as i32), [0, 1, 2, 3, 4, 5, 6]);
        let words: Vec<&str> = EndKind::ALL.iter().map(|k| k.word()).collect();
        let mut unique = words.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), words.len(), "{words:?}");
    }

    #[test]
    fn every_aggregation_has_its_own_word_and_reads_back_from_it() {
        for agg in Aggregation::ALL {
            assert_eq!(agg.word().parse(), Ok(agg));
            assert_eq!(agg.to_string(), agg.word());
        }
        assert_eq!(Aggregation::ALL.map(|a| a as i32), [1, 2, 3, 4, 5, 6]);
        assert_eq!(Aggregation::Unspecified.word(), "raw", "unspecified is raw on the wire");
        assert_eq!(Aggregation::from_word("unspecified"), None);
        let err = "median".parse::<Aggregation>().unwrap_err();
        assert_eq!(err.to_string(), "\"median\" is not an aggregation (raw, mean, min, max, sum or count)");
    }

    #[test]
    fn a_bad_word_is_named_with_the_words_it_could_be() {
        let err = "paused".parse::<RunState>().unwrap_err();
        assert_eq!(err.word, "paused");
        assert_eq!(
            err.to_string(),
            "\"paused\" is not a run state (unspecified, rendezvous, running, finished, failed or metrics-only)"
        );
        let err = "Ended".parse::<GenerationState>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"Ended\" is not a generation state (unspecified, forming, running or ended)"
        );
        let err = "END_KIND_HEARTBEAT".parse::<EndKind>().unwrap_err();
        assert!(
            err.to_string().starts_with("\"END_KIND_HEARTBEAT\" is not an end kind (unspecified, "),
            "{err}"
        );
        assert_eq!(UnknownWord::new("a colour", "x", ["red"]).to_string(), "\"x\" is not a colour (red)");
        assert_eq!(
            UnknownWord::new("a colour", "x", ["red", "blue"]).to_string(),
            "\"x\" is not a colour (red or blue)"
        );
    }
}

//! Where a run is in its life, and the one place that says which event moves
//! it from which state to which.
//!
//! ```text
//!                 the last worker joins          every worker left, none with an error
//!   Rendezvous ──────────────────────────▶ Running ──────────────────────────▶ Finished
//!       │                                    │
//!       │ a worker leaves with an error      │ a worker leaves with an error, or a
//!       ▼                                    ▼ rank falls silent (the watchdog)
//!     Failed ◀───────────────────────────────┘
//! ```
//!
//! A run whose workers all left before the world filled ends from
//! `Rendezvous` as well (finished, or failed if one left with an error). An
//! ended run (finished or failed) takes no join: its id starts over as a new
//! run in `Rendezvous` ([`RunState::has_ended`]). Whether any worker left
//! with an error is remembered by the run (it fails the run once every worker
//! has left, whatever the state then), and handed to [`RunState::on_leave`].
//!
//! The store keeps a state as its word ([`RunState::as_str`], read back with
//! [`FromStr`]); the wire carries it as [`drove_proto::v1::RunState`], whose
//! [`word`](drove_proto::v1::RunState::word) is the same word: the words are
//! drove-proto's ([`drove_proto::words`]), not spelt here.

use std::fmt;
use std::str::FromStr;

use drove_proto::v1;

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RunState {
    /// Workers are joining; the world is not full yet.
    #[default]
    Rendezvous,
    /// Every worker joined.
    Running,
    /// Every worker left, none with an error.
    Finished,
    /// A worker left with an error, or a rank of the running run fell silent.
    Failed,
}

/// What happened to a run, in a [`TransitionError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateEvent {
    /// A worker joined.
    Join,
    /// A worker whose join timed out gave its place back.
    Withdraw,
    /// A rank stopped sending heartbeats.
    Silence,
}

impl fmt::Display for StateEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateEvent::Join => "take a join",
            StateEvent::Withdraw => "give a timed-out join's place back",
            StateEvent::Silence => "fail for a silent rank",
        })
    }
}

/// An event the run's state does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a run that is {from} cannot {event}")]
pub struct TransitionError {
    /// The run's state.
    pub from: RunState,
    /// What happened.
    pub event: StateEvent,
}

/// A stored state that is none of the run states.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", drove_proto::words::UnknownWord::new("a run state", .value, RunState::ALL.map(RunState::as_str)))]
pub struct ParseRunStateError {
    /// What was read.
    pub value: String,
}

impl RunState {
    /// Every state.
    pub const ALL: [RunState; 4] =
        [RunState::Rendezvous, RunState::Running, RunState::Finished, RunState::Failed];

    /// The state's word: `rendezvous`, `running`, `finished` or `failed` (what
    /// the store holds and people read).
    pub fn as_str(self) -> &'static str {
        v1::RunState::from(self).word()
    }

    /// Whether the run is over (finished or failed): a join starts its id over.
    pub fn has_ended(self) -> bool {
        matches!(self, RunState::Finished | RunState::Failed)
    }

    /// How a run ends: failed if any worker left with an error, else finished.
    pub fn ended(failed: bool) -> RunState {
        if failed { RunState::Failed } else { RunState::Finished }
    }

    /// The state after a worker joined, `joined` of `world` workers now in:
    /// running once the world is full. An ended run takes no join (start its
    /// id over first).
    pub fn on_join(self, joined: usize, world: usize) -> Result<RunState, TransitionError> {
        match self {
            RunState::Rendezvous | RunState::Running if joined >= world => Ok(RunState::Running),
            RunState::Rendezvous | RunState::Running => Ok(self),
            RunState::Finished | RunState::Failed => {
                Err(TransitionError { from: self, event: StateEvent::Join })
            }
        }
    }

    /// The state after a worker whose join timed out gave its place back: only
    /// a run still in rendezvous lets it go (a run that started keeps its world).
    pub fn on_withdraw(self) -> Result<RunState, TransitionError> {
        match self {
            RunState::Rendezvous => Ok(self),
            _ => Err(TransitionError { from: self, event: StateEvent::Withdraw }),
        }
    }

    /// The state after a worker left: `all_left` whether every worker has
    /// left now, `failed` whether any (this one included) left with an error.
    /// Once every worker left the run has ended; before, an error fails it
    /// at once, and otherwise the state stays.
    pub fn on_leave(self, all_left: bool, failed: bool) -> RunState {
        if all_left {
            RunState::ended(failed)
        } else if failed {
            RunState::Failed
        } else {
            self
        }
    }

    /// The state after the watchdog found a rank silent: a running run fails.
    pub fn on_silence(self) -> Result<RunState, TransitionError> {
        match self {
            RunState::Running => Ok(RunState::Failed),
            _ => Err(TransitionError { from: self, event: StateEvent::Silence }),
        }
    }

    /// The state a restarted coordinator resumes a stored run that had not
    /// ended in: running if it was, else rendezvous.
    pub fn on_resume(self) -> RunState {
        match self {
            RunState::Running => RunState::Running,
            _ => RunState::Rendezvous,
        }
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for RunState {
    type Err = ParseRunStateError;

    fn from_str(s: &str) -> Result<RunState, ParseRunStateError> {
        RunState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseRunStateError { value: s.to_string() })
    }
}

impl From<RunState> for v1::RunState {
    fn from(state: RunState) -> v1::RunState {
        match state {
            RunState::Rendezvous => v1::RunState::Rendezvous,
            RunState::Running => v1::RunState::Running,
            RunState::Finished => v1::RunState::Finished,
            RunState::Failed => v1::RunState::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_from_its_word_and_a_bad_word_is_named() {
        let words: Vec<String> = RunState::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(words, ["rendezvous", "running", "finished", "failed"]);
        for state in RunState::ALL {
            assert_eq!(state.as_str().parse(), Ok(state));
        }
        let err = "metrics-only".parse::<RunState>().unwrap_err();
        assert_eq!(err.value, "metrics-only");
        assert!(err.to_string().contains("\"metrics-only\" is not a run state"), "{err}");
        assert!("Running".parse::<RunState>().is_err());
    }

    #[test]
    fn a_bad_word_is_named_with_the_four_states_it_could_be() {
        let err = "paused".parse::<RunState>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "\"paused\" is not a run state (rendezvous, running, finished or failed)"
        );
    }

    #[test]
    fn the_wire_state_has_the_same_word() {
        for state in RunState::ALL {
            assert_eq!(v1::RunState::from(state).word(), state.as_str());
        }
    }

    #[test]
    fn a_run_runs_once_the_last_worker_joins() {
        let s = RunState::default();
        assert_eq!(s, RunState::Rendezvous);
        assert_eq!(s.on_join(1, 3), Ok(RunState::Rendezvous));
        assert_eq!(s.on_join(3, 3), Ok(RunState::Running));
        assert_eq!(RunState::Running.on_join(2, 2), Ok(RunState::Running));
        // A resumed running run that lost a member's row stays running.
        assert_eq!(RunState::Running.on_join(1, 2), Ok(RunState::Running));
        for ended in [RunState::Finished, RunState::Failed] {
            assert!(ended.has_ended());
            let err = ended.on_join(1, 2).unwrap_err();
            assert_eq!(err, TransitionError { from: ended, event: StateEvent::Join });
            assert_eq!(err.to_string(), format!("a run that is {ended} cannot take a join"));
        }
        assert!(!RunState::Rendezvous.has_ended() && !RunState::Running.has_ended());
    }

    #[test]
    fn leaving_ends_the_run_once_everyone_left_and_an_error_fails_it_at_once() {
        for s in RunState::ALL {
            assert_eq!(s.on_leave(true, false), RunState::Finished, "{s}");
            assert_eq!(s.on_leave(true, true), RunState::Failed, "{s}");
            assert_eq!(s.on_leave(false, true), RunState::Failed, "{s}");
            assert_eq!(s.on_leave(false, false), s, "{s}");
        }
        assert_eq!(RunState::ended(false), RunState::Finished);
        assert_eq!(RunState::ended(true), RunState::Failed);
    }

    #[test]
    fn only_a_rendezvous_gives_a_place_back_and_only_a_running_run_fails_for_silence() {
        assert_eq!(RunState::Rendezvous.on_withdraw(), Ok(RunState::Rendezvous));
        assert_eq!(RunState::Running.on_silence(), Ok(RunState::Failed));
        for s in [RunState::Running, RunState::Finished, RunState::Failed] {
            assert_eq!(s.on_withdraw(), Err(TransitionError { from: s, event: StateEvent::Withdraw }));
        }
        for s in [RunState::Rendezvous, RunState::Finished, RunState::Failed] {
            assert_eq!(s.on_silence(), Err(TransitionError { from: s, event: StateEvent::Silence }));
        }
    }

    #[test]
    fn a_resumed_run_is_running_only_if_it_was() {
        assert_eq!(RunState::Running.on_resume(), RunState::Running);
        for s in [RunState::Rendezvous, RunState::Finished, RunState::Failed] {
            assert_eq!(s.on_resume(), RunState::Rendezvous);
        }
    }
}

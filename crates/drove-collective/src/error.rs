//! Errors of the collectives. Each names the op and, where other ranks are at
//! fault, which ones.

use std::time::Duration;

/// An op that failed, or a communicator that could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// Ranks called the op with different arguments; no data moved and the
    /// communicator is still usable.
    #[error("{op}: ranks disagree on {field}: {values}")]
    Mismatch {
        /// The op, e.g. `all_reduce "grad.0"`.
        op: String,
        /// The field that differs (`shape`, `dtype`, `root`, ...).
        field: &'static str,
        /// Each value with the ranks that gave it.
        values: String,
    },
    /// The arguments are wrong on this rank alone.
    #[error("{op}: {message}")]
    Invalid {
        /// The op.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// Peers closed their connections (died) during the op.
    #[error("{op}: lost rank(s) {ranks:?}: {detail}")]
    PeerLost {
        /// The op.
        op: String,
        /// The ranks that are gone.
        ranks: Vec<usize>,
        /// What was seen.
        detail: String,
    },
    /// Peers did not answer before the deadline.
    #[error("{op}: timed out after {after:.1?} waiting for rank(s) {ranks:?}")]
    Timeout {
        /// The op.
        op: String,
        /// The ranks waited for.
        ranks: Vec<usize>,
        /// The deadline that passed.
        after: Duration,
    },
    /// Awaited peers were alive (their heartbeats went on) but did not come
    /// within the hang limit.
    #[error(
        "{op}: rank(s) {ranks:?} still alive but did not come within the hang limit of {after:.1?} (DROVE_COMM_HANG_LIMIT)"
    )]
    Hung {
        /// The op.
        op: String,
        /// The ranks waited for.
        ranks: Vec<usize>,
        /// The hang limit that passed.
        after: Duration,
    },
    /// Awaited peers went silent past the stall warning, and other peers hung
    /// up meanwhile: most likely they gave up on the same silent ranks on their
    /// own deadline, so the silent ones are named first.
    #[error(
        "{op}: rank(s) {ranks:?} silent for {after:.1?}; rank(s) {hung_up:?} hung up meanwhile (probably giving up on them)"
    )]
    Stalled {
        /// The op.
        op: String,
        /// The silent ranks waited for.
        ranks: Vec<usize>,
        /// How long they were waited for.
        after: Duration,
        /// The peers that closed their connections.
        hung_up: Vec<usize>,
    },
    /// An earlier failure left the communicator unusable.
    #[error("communicator unusable after an earlier failure: {cause}")]
    Broken {
        /// The earlier failure.
        cause: String,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Ranks could not find each other.
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    /// A peer greeted this rank from another generation of an elastic run:
    /// one of the two was left out when the world re-formed.
    #[error(
        "rank {peer} answered from generation {theirs} of the run, this world is generation {ours}: \
         a rank left out of the run (stopped, then resumed after its world re-formed) is refused"
    )]
    StaleGeneration {
        /// This rank's generation.
        ours: u64,
        /// The peer's.
        theirs: u64,
        /// The peer's rank in the table this rank was given.
        peer: usize,
    },
    /// The coordinator formed a newer world of this elastic run without this
    /// member: it was stopped or cut off for longer than the others waited.
    #[error("left out of the run: {0}")]
    LeftOut(String),
}

impl CommError {
    /// Whether the communicator can still be used after this error (the ranks
    /// disagreed before any data moved, or the arguments were wrong locally).
    pub fn is_recoverable(&self) -> bool {
        matches!(self, CommError::Mismatch { .. } | CommError::Invalid { .. })
    }

    /// Whether this error means a member of the world is gone (died, cut
    /// off, silent past the deadline, alive but hung past the hang limit), so an elastic run re-forms its world
    /// instead of failing: the op's data may be lost, the replica is not.
    pub fn is_membership_loss(&self) -> bool {
        matches!(
            self,
            CommError::PeerLost { .. }
                | CommError::Timeout { .. }
                | CommError::Hung { .. }
                | CommError::Stalled { .. }
                | CommError::Broken { .. }
        )
    }

    /// An I/O failure while `context` (what was being done, and where).
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        CommError::Io { context: context.into(), source }
    }
}

/// A rank or world size that cannot be, met while ranks find each other.
impl From<crate::place::PlaceError> for CommError {
    fn from(e: crate::place::PlaceError) -> Self {
        CommError::Rendezvous(e.to_string())
    }
}

//! What can go wrong, each naming what was wrong and where.

/// A launch variable that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A variable holds a value of the wrong shape.
    #[error("{var}={value:?} is not {expected}")]
    Malformed {
        /// The variable.
        var: &'static str,
        /// What it holds.
        value: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// The rank and world size do not fit together (missing, out of range,
    /// or two rank variables that disagree).
    #[error("{0}")]
    Place(String),
}

/// Why a launch, or a rank's use of the contract, failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The launch environment is unusable.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The spec asks for something impossible.
    #[error("{0}")]
    Spec(String),
    /// Talking to the coordinator failed.
    #[error("{0}")]
    Coordinator(String),
    /// Joining the other ranks failed.
    #[error("joining the other ranks: {0}")]
    Comm(#[from] drove_collective::CommError),
    /// The metrics recorder cannot start.
    #[error("starting the metrics recorder: {0}")]
    Metrics(#[from] drove_metrics::RecorderError),
    /// A rank could not be started (or watched).
    #[error("cannot start rank {rank}: {program}: {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// A system call the launcher needs failed.
    #[error("{what}: {source}")]
    Io {
        /// What the launcher was doing.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The launcher lost track of the ranks (its waiting threads are gone).
    #[error("lost track of the ranks")]
    LostTrack,
}

impl LaunchError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        LaunchError::Io { what: what.into(), source }
    }
}

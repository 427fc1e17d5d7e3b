//! [`Liveness`]: what a communicator asks about the peers that keep an op
//! waiting past its deadline, so a slow peer is not taken for a lost one.

use std::fmt::Debug;
use std::time::Duration;

/// Tells, for peers an op still waits for at its deadline, which ones show
/// no sign of life.
///
/// A peer whose process died is named at once (its connections close); one
/// that stopped (a frozen machine, a cut link) is lost at the op's deadline.
/// But a peer starved of CPU, or paging, or still in a long evaluation is
/// alive and will come: torch's process-group timeout is 10 to 30 minutes
/// for that reason, and Horovod only warns about stalls. Given a `Liveness`
/// ([`CommOptions::liveness`](crate::CommOptions::liveness)), a communicator
/// at the deadline fails only for the peers this names silent, and waits
/// for the others, warning, up to [`CommOptions::hang_limit`](crate::CommOptions::hang_limit).
/// An elastic run's membership client answers from the heartbeats its
/// coordinator relays; without one, the deadline is final.
pub trait Liveness: Send + Sync + Debug {
    /// Of `ranks` (ranks of the current world), those not known to be alive
    /// now: no sign of life for too long, or never any.
    fn silent(&self, ranks: &[usize]) -> Vec<usize>;
}

/// How long past an op's deadline a communicator waits for peers that are
/// alive, by default: a peer that has not come in that long is hung.
pub const DEFAULT_HANG_LIMIT: Duration = Duration::from_secs(600);

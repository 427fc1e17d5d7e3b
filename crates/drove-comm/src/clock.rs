//! [`Clock`]: one op's deadline, its stall warnings and, past the deadline,
//! the wait for peers that are slow but alive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::liveness::Liveness;
use drove_collective::CommError;

/// How often, at most, the wait for live peers past the deadline warns.
const HANG_WARNING_EVERY: Duration = Duration::from_secs(10);

/// How long one poll may block past the deadline, so a peer named silent is
/// noticed soon.
const PAST_DEADLINE_SLICE: Duration = Duration::from_millis(250);

/// The deadlines every op of a communicator runs under.
#[derive(Clone, Debug)]
pub(crate) struct Deadlines {
    /// An op not done after this long fails for the peers it waits for,
    /// unless `liveness` says they are alive.
    pub timeout: Duration,
    /// A warning names the ranks waited for after this long.
    pub warn_after: Duration,
    /// Which peers that keep an op waiting past `timeout` are silent.
    pub liveness: Option<Arc<dyn Liveness>>,
    /// How long past its start an op waits for peers that are alive.
    pub hang_limit: Duration,
}

impl Deadlines {
    /// Deadlines without a liveness: `timeout` is final.
    pub fn fixed(timeout: Duration, warn_after: Duration) -> Deadlines {
        Deadlines { timeout, warn_after, liveness: None, hang_limit: timeout }
    }
}

/// Deadline, stall warning and the op they belong to.
#[derive(Clone, Debug)]
pub(crate) struct Clock {
    pub op: String,
    pub start: Instant,
    pub timeout: Duration,
    pub warn_after: Duration,
    pub warned: bool,
    liveness: Option<Arc<dyn Liveness>>,
    hang_limit: Duration,
    /// Past the deadline: when the next warning about live peers is due.
    next_hang_warning: Duration,
    /// Past the deadline: when the peers are next looked at (a wait polls
    /// far more often than their state can change).
    next_look: Duration,
}

impl Clock {
    pub fn new(op: String, deadlines: &Deadlines) -> Self {
        Clock {
            op,
            start: Instant::now(),
            timeout: deadlines.timeout,
            warn_after: deadlines.warn_after,
            warned: false,
            liveness: deadlines.liveness.clone(),
            hang_limit: deadlines.hang_limit,
            next_hang_warning: Duration::ZERO,
            next_look: Duration::ZERO,
        }
    }

    /// The same op with `grace` more before its deadline and its hang limit
    /// (a host's ranks wait that much longer for their leader, whose own
    /// error is the one to report).
    pub fn with_grace(&self, grace: Duration) -> Clock {
        Clock { timeout: self.timeout + grace, hang_limit: self.hang_limit + grace, ..self.clone() }
    }

    /// Past the deadline, whether it is time to look at the peers again
    /// (every [`PAST_DEADLINE_SLICE`]); before it, always.
    pub fn look_due(&mut self) -> bool {
        let elapsed = self.start.elapsed();
        if elapsed < self.timeout || elapsed >= self.next_look {
            self.next_look = elapsed + PAST_DEADLINE_SLICE;
            return true;
        }
        false
    }

    /// Whether the op's deadline has passed.
    pub fn past_deadline(&self) -> bool {
        self.start.elapsed() >= self.timeout
    }

    /// Errors if the deadline passed, for the peers waited for that the
    /// liveness names silent (all of them without one), or once the hang
    /// limit passed too; warns once after `warn_after`, and past the deadline
    /// now and then while it waits for live peers.
    pub fn check(&mut self, waiting_for: &[usize]) -> Result<(), CommError> {
        let elapsed = self.start.elapsed();
        if elapsed >= self.timeout {
            return self.past_deadline_check(waiting_for, elapsed);
        }
        if !self.warned && elapsed >= self.warn_after {
            self.warned = true;
            tracing::warn!(
                op = %self.op,
                ranks = ?waiting_for,
                "stalled for {:.1?}: still waiting for rank(s) {:?} (failing after {:.1?})",
                elapsed, waiting_for, self.timeout
            );
        }
        Ok(())
    }

    fn past_deadline_check(&mut self, waiting_for: &[usize], elapsed: Duration) -> Result<(), CommError> {
        let Some(liveness) = &self.liveness else {
            return Err(CommError::Timeout {
                op: self.op.clone(),
                ranks: waiting_for.to_vec(),
                after: self.timeout,
            });
        };
        // Nobody left to wait for (the last one came since the caller
        // looked): the caller's loop ends at its next look.
        let silent = if waiting_for.is_empty() { Vec::new() } else { liveness.silent(waiting_for) };
        if !silent.is_empty() {
            return Err(CommError::Timeout { op: self.op.clone(), ranks: silent, after: elapsed });
        }
        if elapsed >= self.hang_limit {
            return Err(CommError::Hung {
                op: self.op.clone(),
                ranks: waiting_for.to_vec(),
                after: self.hang_limit,
            });
        }
        if elapsed >= self.next_hang_warning && !waiting_for.is_empty() {
            self.warned = true;
            self.next_hang_warning = elapsed + HANG_WARNING_EVERY.max(self.warn_after);
            tracing::warn!(
                op = %self.op,
                ranks = ?waiting_for,
                "stalled for {:.1?}, past the {:.1?} deadline: rank(s) {:?} still alive (heartbeats), \
                 waiting for them up to the hang limit of {:.1?}",
                elapsed, self.timeout, waiting_for, self.hang_limit
            );
        }
        Ok(())
    }

    /// How long one poll may block: until the next warning or the deadline,
    /// at most 1 s; past the deadline a quarter of a second.
    pub fn slice(&self) -> Duration {
        let elapsed = self.start.elapsed();
        if elapsed >= self.timeout {
            return PAST_DEADLINE_SLICE;
        }
        let next = if !self.warned && elapsed < self.warn_after { self.warn_after } else { self.timeout };
        next.saturating_sub(elapsed).min(Duration::from_secs(1)).max(Duration::from_millis(1))
    }
}

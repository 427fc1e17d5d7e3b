//! The restart policy: after a failed attempt, start the whole world again
//! (torchrun's `--max-restarts`), up to a limit; never after an interruption.

use crate::launcher::supervise::Attempt;

/// How many times a failed world is started again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed after the first attempt (0: none).
    pub max_restarts: u32,
}

/// What follows an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The attempt succeeded, was interrupted, or no restart is left: the launch ends.
    Done,
    /// Start the world again, for this reason.
    Restart(String),
}

impl RestartPolicy {
    /// What follows `attempt` after `restarts` restarts so far.
    pub(crate) fn next(&self, restarts: u32, attempt: &Attempt) -> Next {
        let Some(why) = attempt.failure() else { return Next::Done };
        if attempt.decision.interrupted.is_some() {
            return Next::Done;
        }
        if restarts >= self.max_restarts {
            if self.max_restarts > 0 {
                tracing::error!("giving up after {restarts} restart(s): {why}");
            }
            return Next::Done;
        }
        Next::Restart(why)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::ExitStatus;

    use super::*;
    use crate::launcher::supervise::{Cause, Decision};

    fn attempt(failed_rank: Option<usize>, interrupted: Option<i32>) -> Attempt {
        let statuses = (0..2)
            .map(|r| Ok(ExitStatus::from_raw(if Some(r) == failed_rank { 1 << 8 } else { 0 })))
            .collect();
        Attempt {
            statuses,
            decision: Decision {
                first_failure: failed_rank.map(|r| (r, 1)),
                cause: failed_rank.map(Cause::RankFailed).or(interrupted.map(Cause::Signal)),
                interrupted,
                run_failed: None,
                below_minimum: None,
            },
            restarts: 0,
        }
    }

    #[test]
    fn a_failed_world_restarts_until_the_limit() {
        let policy = RestartPolicy { max_restarts: 2 };
        let failed = attempt(Some(1), None);
        assert_eq!(policy.next(0, &failed), Next::Restart("rank 1 failed (exit code 1)".into()));
        assert_eq!(policy.next(1, &failed), Next::Restart("rank 1 failed (exit code 1)".into()));
        assert_eq!(policy.next(2, &failed), Next::Done);
        assert_eq!(RestartPolicy::default().next(0, &failed), Next::Done);
    }

    #[test]
    fn success_and_interruption_end_the_launch() {
        let policy = RestartPolicy { max_restarts: 5 };
        assert_eq!(policy.next(0, &attempt(None, None)), Next::Done);
        let mut interrupted = attempt(Some(0), Some(libc::SIGINT));
        interrupted.decision.cause = Some(Cause::Signal(libc::SIGINT));
        assert_eq!(policy.next(0, &interrupted), Next::Done);
    }
}

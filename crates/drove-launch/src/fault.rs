//! Faults a rank brings on itself, on demand, for tests of what the
//! launcher, the coordinator and the other ranks do about them: the rank
//! killed with `SIGKILL` (as the OOM killer or a lost node kills: no exit
//! code, no goodbye) right after a step or at a named collective op, stopped
//! for a while with its heartbeats going on, or an action of the caller's
//! (a device destroyed, as a driver reset would) right after a step.
//!
//! A fault of the process (a kill, a stop) strikes in the first attempt
//! only: restarts are what such a test watches, and a fault that struck in
//! every attempt would never let the run finish. Each fault strikes once and
//! announces itself first, on stderr, in one line naming the rank, the step
//! or op, and why (the flag that asked for it): a killed process says
//! nothing after, and that line is what a test or a reader of the log looks
//! for. The caller names *where* in its loop a fault strikes (its step
//! count, its ops' names through a [`Trigger`]); this module knows no
//! trainer.
//!
//! ```no_run
//! use drove_launch::fault::Faults;
//!
//! // Rank 1 killed right after step 5, in the first attempt only.
//! let mut faults = Faults::new(0).kill_after_step(5, 1, "--fail-at-step");
//! for step in 1..=10 {
//!     // ... the step ...
//!     faults.after_step(step, 1, || { /* flush what must not be lost */ });
//! }
//! ```

use std::time::Duration;

use drove_collective::Collective;
use drove_collective::fault::{Faulty, Trigger};

/// The faults one rank brings on itself (see the [module](self)).
#[derive(Default)]
pub struct Faults {
    /// Whether faults of the process strike: in the first attempt only.
    first_attempt: bool,
    after_step: Vec<AfterStep>,
    at_op: Option<AtOp>,
}

/// A fault right after a step: on one rank, or on every rank.
struct AfterStep {
    step: u64,
    rank: Option<usize>,
    strike: Strike,
    cause: String,
}

/// What a fault after a step does.
enum Strike {
    Kill,
    Stop(Duration),
    Run { what: String, action: Box<dyn FnOnce()> },
}

/// A kill at a named op, on one rank.
struct AtOp {
    rank: usize,
    trigger: Trigger,
    place: String,
    cause: String,
}

impl Faults {
    /// No fault yet, in the attempt `restart_count` counts (0: the first;
    /// `LaunchEnv::restart_count`): after a restart the kills and stops
    /// planned below are left out.
    pub fn new(restart_count: u32) -> Faults {
        Faults { first_attempt: restart_count == 0, after_step: Vec::new(), at_op: None }
    }

    /// Kills rank `rank` with `SIGKILL` right after its step `step` (first
    /// attempt only); `cause` says why in its announcement (a flag).
    pub fn kill_after_step(mut self, step: u64, rank: usize, cause: &str) -> Faults {
        if self.first_attempt {
            self.after_step.push(AfterStep {
                step,
                rank: Some(rank),
                strike: Strike::Kill,
                cause: cause.into(),
            });
        }
        self
    }

    /// Stops rank `rank` for `time` right after its step `step`, once (first
    /// attempt only): a slow member, whose heartbeats go on.
    pub fn stop_after_step(mut self, step: u64, rank: usize, time: Duration, cause: &str) -> Faults {
        if self.first_attempt {
            let strike = Strike::Stop(time);
            self.after_step.push(AfterStep { step, rank: Some(rank), strike, cause: cause.into() });
        }
        self
    }

    /// Runs `action` on every rank right after step `step`, in every attempt;
    /// `what` names it in the announcement (`destroying the device`).
    pub fn run_after_step(
        mut self,
        step: u64,
        what: &str,
        action: impl FnOnce() + 'static,
        cause: &str,
    ) -> Faults {
        let strike = Strike::Run { what: what.into(), action: Box::new(action) };
        self.after_step.push(AfterStep { step, rank: None, strike, cause: cause.into() });
        self
    }

    /// Kills rank `rank` (its rank in the first world) with `SIGKILL` at the
    /// op `trigger` names, through [`Faults::collective`] (first attempt
    /// only); `place` says where that is in the caller's loop (`in the
    /// backward pass of step 5`).
    pub fn kill_at_op(mut self, rank: usize, trigger: Trigger, place: &str, cause: &str) -> Faults {
        if self.first_attempt {
            self.at_op = Some(AtOp { rank, trigger, place: place.into(), cause: cause.into() });
        }
        self
    }

    /// Brings on the faults planned right after step `step` on rank `rank`
    /// (this process's rank in its current world), each once; `before_kill`
    /// runs first where one kills the process (to deliver what must not be
    /// lost: a kill leaves no chance after).
    pub fn after_step(&mut self, step: u64, rank: usize, before_kill: impl FnOnce()) {
        let mut before_kill = Some(before_kill);
        let (due, rest) = std::mem::take(&mut self.after_step)
            .into_iter()
            .partition(|f| f.step == step && f.rank.is_none_or(|r| r == rank));
        self.after_step = rest;
        for fault in due {
            let AfterStep { cause, strike, .. } = fault;
            match strike {
                Strike::Kill => {
                    if let Some(before_kill) = before_kill.take() {
                        before_kill();
                    }
                    eprintln!("rank {rank}: killing itself with SIGKILL after step {step} ({cause})");
                    kill_self();
                }
                Strike::Stop(time) => {
                    eprintln!(
                        "rank {rank}: stopping for {time:.1?} after step {step}, heartbeats going on ({cause})"
                    );
                    std::thread::sleep(time);
                }
                Strike::Run { what, action } => {
                    eprintln!("rank {rank}: {what} after step {step} ({cause})");
                    action();
                }
            }
        }
    }

    /// `comm`, killing this process at the planned op when `rank` (this
    /// process's rank in the first world) is the one planned; `None` where
    /// no op is.
    pub fn collective<'a, C: Collective + ?Sized>(&self, comm: &'a C, rank: usize) -> Option<Faulty<'a, C>> {
        let at = self.at_op.as_ref().filter(|at| at.rank == rank)?;
        let (place, cause) = (at.place.clone(), at.cause.clone());
        Some(Faulty::new(comm, at.trigger.clone()).on_strike(move |comm, op| {
            eprintln!("rank {}: killing itself with SIGKILL {place}, at {op} ({cause})", comm.rank());
            kill_self();
        }))
    }
}

/// Kills this process with `SIGKILL`: no destructor, handler or exit code
/// runs, as when the OOM killer or a lost node ends a rank.
pub fn kill_self() -> ! {
    // SAFETY: kill(2) on this process; nothing is left to clean up.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!("SIGKILL cannot be caught")
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use drove_collective::SingleProcess;

    use super::*;

    #[test]
    fn an_action_strikes_once_on_every_rank_at_its_step_in_every_attempt() {
        let runs = Rc::new(Cell::new(0));
        for attempt in [0, 1] {
            let seen = Rc::clone(&runs);
            let mut faults = Faults::new(attempt).run_after_step(
                2,
                "counting",
                move || seen.set(seen.get() + 1),
                "--test",
            );
            for step in 1..=3 {
                faults.after_step(step, 3, || panic!("nothing kills"));
            }
            faults.after_step(2, 3, || panic!("nothing kills"));
        }
        assert_eq!(runs.get(), 2, "once an attempt, on any rank");
    }

    #[test]
    fn a_restarted_attempt_plans_no_kill_or_stop() {
        let mut faults = Faults::new(1)
            .kill_after_step(1, 0, "--fail-at-step")
            .stop_after_step(1, 0, Duration::from_secs(3600), "--stall-at-step")
            .kill_at_op(0, Trigger::nth_op(1), "anywhere", "--fail-in-backward");
        faults.after_step(1, 0, || panic!("no kill after a restart"));
        assert!(faults.collective(&SingleProcess, 0).is_none());
    }

    #[test]
    fn a_kill_at_an_op_wraps_only_the_rank_it_names() {
        let faults =
            Faults::new(0).kill_at_op(1, Trigger::named("grad").nth(2), "in step 2", "--fail-in-backward");
        assert!(faults.collective(&SingleProcess, 0).is_none());
        let faulty = faults.collective(&SingleProcess, 1).expect("rank 1 is the one");
        assert_eq!(faulty.trigger(), &Trigger::named("grad").nth(2));
    }

    #[test]
    fn a_kill_or_stop_on_another_rank_or_step_does_nothing() {
        let mut faults = Faults::new(0).kill_after_step(5, 1, "--fail-at-step").stop_after_step(
            5,
            1,
            Duration::from_secs(3600),
            "--stall-at-step",
        );
        for step in 1..=4 {
            faults.after_step(step, 1, || panic!("not yet"));
        }
        faults.after_step(5, 0, || panic!("another rank"));
    }
}

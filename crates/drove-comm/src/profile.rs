//! The TCP ring's own account of where an op's time goes, per ring step
//! (opt-in, [`Communicator::set_ring_profile`](crate::Communicator::set_ring_profile)):
//! time in the `send` and `recv` system calls, in the reduction, and waiting
//! in `poll`, and the bytes still queued in the sending socket after each
//! send (the bytes in flight). Off, it costs one branch per system call.

use std::time::Duration;

/// One ring step's totals over the ops profiled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingStep {
    /// `reduce-scatter` or `all-gather`.
    pub phase: &'static str,
    /// The step within its phase, `0..world - 1`.
    pub step: usize,
    /// Ops counted.
    pub ops: u64,
    /// Wall time of the step.
    pub total: Duration,
    /// In `send` system calls.
    pub send: Duration,
    /// In `recv` system calls.
    pub recv: Duration,
    /// Combining received bytes into the buffer (reduce-scatter only).
    pub reduce: Duration,
    /// Blocked in `poll`, neither side able to move.
    pub wait: Duration,
    /// Bytes sent.
    pub bytes: u64,
    /// `send` calls that moved bytes.
    pub sends: u64,
    /// The most bytes queued unsent in the socket after a send.
    pub max_unsent: u64,
    /// The sum of the bytes queued unsent after each send (over `sends`: the mean).
    pub unsent_sum: u64,
}

impl RingStep {
    /// The time of the step not in a system call, the reduction or `poll`
    /// (the loop itself, copies, page faults).
    pub fn other(&self) -> Duration {
        self.total.saturating_sub(self.send + self.recv + self.reduce + self.wait)
    }

    /// Mean bytes queued unsent after a send.
    pub fn mean_unsent(&self) -> f64 {
        if self.sends == 0 { 0.0 } else { self.unsent_sum as f64 / self.sends as f64 }
    }
}

/// What one exchange measured, while profiling.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ExchangeTimes {
    pub send: Duration,
    pub recv: Duration,
    pub wait: Duration,
    pub sends: u64,
    pub unsent_sum: u64,
    pub max_unsent: u64,
}

/// Every step's profile of the ops since profiling began, by phase then step.
#[derive(Debug, Default)]
pub(crate) struct RingProfile {
    steps: Vec<RingStep>,
}

impl RingProfile {
    /// Adds one exchange of step `step` of `phase` to its totals.
    pub fn add(
        &mut self,
        phase: &'static str,
        step: usize,
        total: Duration,
        reduce: Duration,
        bytes: usize,
        x: ExchangeTimes,
    ) {
        let i = match self.steps.iter().position(|s| s.phase == phase && s.step == step) {
            Some(i) => i,
            None => {
                self.steps.push(RingStep { phase, step, ..RingStep::default() });
                self.steps.len() - 1
            }
        };
        let s = &mut self.steps[i];
        s.ops += 1;
        s.total += total;
        s.send += x.send;
        s.recv += x.recv;
        s.reduce += reduce;
        s.wait += x.wait;
        s.bytes += bytes as u64;
        s.sends += x.sends;
        s.max_unsent = s.max_unsent.max(x.max_unsent);
        s.unsent_sum += x.unsent_sum;
    }

    /// The steps, in the order first seen (phase by phase, step by step).
    pub fn into_steps(self) -> Vec<RingStep> {
        self.steps
    }
}

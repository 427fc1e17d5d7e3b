//! The phases of a step: the time each took ([`PhaseTimes`], in every
//! [`StepOutcome`](crate::StepOutcome)) and how a phase is timed and recorded
//! on the timeline.

use std::time::{Duration, Instant};

use crate::timeline::{Timeline, Track};

/// The time a step spent in each phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct PhaseTimes {
    /// Forward and backward passes (all micro-batches and passes of the step).
    pub compute: Duration,
    /// The gradient all-reduce; of an overlapped step, the part left after
    /// backward ended (exposed communication).
    pub all_reduce: Duration,
    /// Of an overlapped step, the engine's whole all-reduce time, most of it
    /// during backward (zero for a step that did not overlap).
    pub communication: Duration,
    /// The global norm and clipping.
    pub clip: Duration,
    /// The optimizer update and writing the parameters back.
    pub update: Duration,
}

/// Runs `f`, adding the time it took to `slot` and recording it on the
/// timeline's main track as phase `name`.
pub(crate) fn phase<T>(timeline: &Timeline, name: &str, slot: &mut Duration, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    *slot += started.elapsed();
    timeline.record(name, "phase", Track::Main, started);
    out
}

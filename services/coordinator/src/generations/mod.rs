//! An elastic run as a sequence of generations: every world it trains in is
//! one [`Generation`] (1, 2, ...), and this module holds every transition
//! between them, as plain data with no I/O, so it is tested alone.
//!
//! ```text
//!             enough members joined              a member re-joins, or
//!   Forming ─────────────────────────▶ Running ──────────────────────▶ Ended
//!      │        (the closing rule)         │    every member left, or
//!      │                                   │    one left with an error
//!      └───── the run fails ───────────────┴──────────────────────────▶ Ended
//! ```
//!
//! At most one generation forms at a time, and it is the newest. It closes
//! (starts running, with dense ranks) only once the one before it has ended,
//! so two generations never run at once: the one before keeps running until
//! one of its members re-joins (a member that re-joins has stopped training
//! in it), which ends it. [`Generations::try_close`] is the closing rule:
//! `max_size` members, or at least `min_size` and either every member of the
//! previous generation not named lost is back or the settle time has passed
//! since the last join. A member whose generation was replaced by one formed
//! without it was left out ([`GenerationError::LeftOut`]). A join is
//! idempotent while its member waits in the forming generation (same id and
//! address), and after it closed too until the member's first heartbeat in
//! it (the answer was lost: a retry, not a re-join).
//!
//! Every change marks the generations it touched; the service writes those
//! ([`Generations::take_changed`]) to the store under the run's lock.

mod error;
mod machine;
mod state;

pub use drove_store::generation::{
    DEFAULT_SETTLE, Generation, GenerationEnding, GenerationState, Member, ParseGenerationStateError,
};
pub use error::GenerationError;
pub use machine::{Generations, MAX_LOSSES_IN_A_ROW};
pub use state::{Heard, LastBeat, MemberJoin};

#[cfg(test)]
mod tests;

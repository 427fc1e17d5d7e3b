//! What goes into the generation machine and what comes out of it: a join,
//! a heartbeat's answer, a member's last beat. The generations themselves
//! are plain data in the store ([`drove_store::generation`]).

use std::time::{Duration, Instant};

use drove_store::generation::GenerationEnding;

/// A join of an elastic run, checked field by field.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberJoin {
    /// The member's stable id.
    pub member_id: String,
    /// Its data-plane address.
    pub address: String,
    /// Its host.
    pub host: String,
    /// The fewest members a generation may start with.
    pub min: usize,
    /// The most members a generation takes.
    pub max: usize,
    /// The last generation it was part of (0: none).
    pub after: i64,
    /// How long a forming generation waits for more once it has `min`.
    pub settle: Duration,
    /// Its last applied step.
    pub step: i64,
    /// Why it re-forms.
    pub cause: GenerationEnding,
}

/// What a heartbeat of a member answers.
#[derive(Clone, Debug, PartialEq)]
pub struct Heard {
    /// The newest generation's number.
    pub newest: i64,
    /// Whether a generation newer than the member's forms or runs.
    pub reform: bool,
    /// Why, when known.
    pub cause: Option<GenerationEnding>,
}

/// A member's last heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastBeat {
    /// When it came.
    pub at: Instant,
    /// The generation the member said it was in.
    pub generation: i64,
}

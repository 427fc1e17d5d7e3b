//! Elastic worlds: the vocabulary of a run whose membership changes.
//!
//! An elastic run is a sequence of worlds, its *generations*. A *member* (a
//! stable id: a pod's index, a launcher's slot) is not a rank: ranks are handed
//! out densely again in each generation. When a member is lost (its
//! connections close, a collective's deadline passes, its heartbeats stop) or
//! one asks to join, the world ends and its members form the next one; the
//! caller keeps its model and data in memory across the change. [`Elastic`] is
//! that seam: a [`Collective`] that can re-form; drove's membership client
//! (`ElasticComm`) implements it through a drove coordinator.

use std::fmt;
use std::str::FromStr;

use crate::collective::Collective;
use crate::error::CommError;
use crate::place::{Place, WorldSize};

/// A member's stable id: non-empty, at most 128 characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MemberId(String);

impl MemberId {
    /// The id `id`; an error naming it if it is empty or longer than 128 characters.
    pub fn new(id: impl Into<String>) -> Result<MemberId, CommError> {
        let id = id.into();
        if id.is_empty() || id.chars().count() > 128 {
            return Err(CommError::Rendezvous(format!(
                "a member id must be 1 to 128 characters, found {id:?} ({} characters)",
                id.chars().count()
            )));
        }
        Ok(MemberId(id))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The sizes an elastic world may have: `MIN:MAX` (torchrun's `--nnodes`),
/// `1 <= MIN <= MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorldRange {
    min: WorldSize,
    max: WorldSize,
}

impl WorldRange {
    /// `min..=max` members; an error naming both if `min` is 0 or above `max`.
    pub fn new(min: usize, max: usize) -> Result<WorldRange, CommError> {
        let min = WorldSize::new(min)
            .map_err(|_| CommError::Rendezvous(format!("world range {min}:{max}: MIN must be at least 1")))?;
        let max = WorldSize::new(max)
            .map_err(|_| CommError::Rendezvous(format!("world range {min}:{max}: MAX must be at least 1")))?;
        if min > max {
            return Err(CommError::Rendezvous(format!("world range {min}:{max}: MIN is above MAX")));
        }
        Ok(WorldRange { min, max })
    }

    /// The fewest members a world may run with.
    pub fn min(self) -> WorldSize {
        self.min
    }

    /// The most members a world takes.
    pub fn max(self) -> WorldSize {
        self.max
    }
}

impl fmt::Display for WorldRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.min, self.max)
    }
}

/// `MIN:MAX`, or `N` for `N:N`.
///
/// ```
/// use drove_collective::WorldRange;
/// let r: WorldRange = "3:4".parse()?;
/// assert_eq!((r.min().get(), r.max().get()), (3, 4));
/// assert_eq!("4".parse::<WorldRange>()?, WorldRange::new(4, 4)?);
/// assert!("4:3".parse::<WorldRange>().unwrap_err().to_string().contains("MIN is above MAX"));
/// assert!("0:2".parse::<WorldRange>().unwrap_err().to_string().contains("MIN must be at least 1"));
/// # Ok::<(), drove_collective::CommError>(())
/// ```
impl FromStr for WorldRange {
    type Err = CommError;

    fn from_str(s: &str) -> Result<WorldRange, CommError> {
        let number = |part: &str| {
            part.trim().parse::<usize>().map_err(|_| {
                CommError::Rendezvous(format!(
                    "world range {s:?}: {part:?} is not a whole number (MIN:MAX or N)"
                ))
            })
        };
        match s.split_once(':') {
            Some((min, max)) => WorldRange::new(number(min)?, number(max)?),
            None => {
                let n = number(s)?;
                WorldRange::new(n, n)
            }
        }
    }
}

/// How a member saw its world end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// A peer's connection closed (its process died).
    ClosedConnection,
    /// A collective's deadline passed waiting for a peer (stopped or cut off).
    Deadline,
    /// The coordinator saw a member's heartbeats stop.
    Heartbeat,
    /// A member asked to join: the world re-forms at a step boundary.
    MemberAdded,
}

impl fmt::Display for Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Loss::ClosedConnection => "closed connection",
            Loss::Deadline => "collective deadline",
            Loss::Heartbeat => "heartbeat",
            Loss::MemberAdded => "member added",
        })
    }
}

/// Why a world re-forms: how it was seen, which members, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReformCause {
    /// How it was seen.
    pub kind: Loss,
    /// The members lost (or added), where known.
    pub members: Vec<String>,
    /// What was seen, in words.
    pub detail: String,
}

impl ReformCause {
    /// The cause of a collective's error `e` in `world` (whose members by rank
    /// name the ranks the error names).
    pub fn of_error(e: &CommError, world: &World) -> ReformCause {
        let (kind, ranks): (Loss, &[usize]) = match e {
            CommError::PeerLost { ranks, .. } => (Loss::ClosedConnection, ranks),
            CommError::Timeout { ranks, .. } | CommError::Stalled { ranks, .. } => (Loss::Deadline, ranks),
            _ => (Loss::ClosedConnection, &[]),
        };
        let members = ranks.iter().filter_map(|&r| world.members.get(r).cloned()).collect();
        ReformCause { kind, members, detail: e.to_string() }
    }
}

impl fmt::Display for ReformCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if !self.members.is_empty() {
            write!(f, " (members {})", self.members.join(", "))?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// One world of an elastic run, as a member sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct World {
    /// Its generation: 1, 2, ...
    pub generation: u64,
    /// This member's rank in it.
    pub place: Place,
    /// Every member's id, by rank.
    pub members: Vec<String>,
}

/// A [`Collective`] whose world can end and re-form with other members, the
/// caller keeping its state in memory across the change.
pub trait Elastic: Collective {
    /// The world this member is in now.
    fn world(&self) -> World;

    /// The sizes this run's worlds may have.
    fn range(&self) -> WorldRange;

    /// Whether the world should re-form at this step boundary because a
    /// member asked to join (or the coordinator saw one lost): every rank
    /// calls this at the same steps and all get the same answer (one small
    /// all-reduce).
    fn reform_wanted(&self) -> Result<bool, CommError>;

    /// Ends this world (closing its connections) and joins the next one,
    /// telling the coordinator `step`, this member's last applied step, and
    /// `cause`. Waits for the next world up to the rendezvous timeout; an
    /// error if it stays below its minimum that long ([`CommError::Rendezvous`],
    /// naming the lost members) or if it formed without this member
    /// ([`CommError::LeftOut`]).
    fn reform(&self, step: u64, cause: &ReformCause) -> Result<World, CommError>;

    /// Tells the coordinator this member is done (with an error if it failed).
    fn leave(&self, step: u64, error: Option<&str>) -> Result<(), CommError>;
}

//! The vocabulary of an elastic run's generations: where one is in its
//! life ([`GenerationState`]), why it ended ([`GenerationEnding`]) and its members.
//! Plain data, stored by [`Store::put_generation`](crate::Store::put_generation);
//! the transitions are the coordinator's (`drove_coordinator::generations`).

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use drove_proto::v1;
use serde::{Deserialize, Serialize};

/// How long a forming generation with at least `min_size` members waits for
/// more since its last join, when the join does not say (`settle_ms` 0).
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(2);

/// Where a generation is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GenerationState {
    /// Members are joining.
    #[default]
    Forming,
    /// Its world trains.
    Running,
    /// It ended (see its `end`).
    Ended,
}

/// A stored generation state that is none of them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}",
    drove_proto::words::UnknownWord::new("a generation state", .value, GenerationState::ALL.map(GenerationState::as_str))
)]
pub struct ParseGenerationStateError {
    /// What was read.
    pub value: String,
}

impl GenerationState {
    /// Every state.
    pub const ALL: [GenerationState; 3] =
        [GenerationState::Forming, GenerationState::Running, GenerationState::Ended];

    /// The state's word, as the store holds it: its wire state's
    /// [`word`](v1::GenerationState::word).
    pub fn as_str(self) -> &'static str {
        v1::GenerationState::from(self).word()
    }
}

impl fmt::Display for GenerationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for GenerationState {
    type Err = ParseGenerationStateError;

    fn from_str(s: &str) -> Result<GenerationState, ParseGenerationStateError> {
        GenerationState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ParseGenerationStateError { value: s.to_string() })
    }
}

impl From<GenerationState> for v1::GenerationState {
    fn from(state: GenerationState) -> v1::GenerationState {
        match state {
            GenerationState::Forming => v1::GenerationState::Forming,
            GenerationState::Running => v1::GenerationState::Running,
            GenerationState::Ended => v1::GenerationState::Ended,
        }
    }
}

/// Why a generation ended (or why a newer one forms while it runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GenerationEnding {
    /// How it was seen.
    pub kind: v1::EndKind,
    /// The members lost (or added, for [`v1::EndKind::MemberAdded`]).
    pub members: Vec<String>,
    /// What was seen, in words.
    pub detail: String,
}

impl GenerationEnding {
    /// An end of `kind` naming `members`, without detail.
    pub fn of(kind: v1::EndKind, members: &[&str]) -> GenerationEnding {
        GenerationEnding {
            kind,
            members: members.iter().map(|m| m.to_string()).collect(),
            detail: String::new(),
        }
    }

    /// As the wire carries it.
    pub fn to_proto(&self) -> v1::GenerationEnd {
        v1::GenerationEnd {
            kind: self.kind.into(),
            members: self.members.clone(),
            detail: self.detail.clone(),
        }
    }

    /// From the wire (an unknown kind reads as unspecified).
    pub fn from_proto(end: &v1::GenerationEnd) -> GenerationEnding {
        GenerationEnding {
            kind: v1::EndKind::try_from(end.kind).unwrap_or(v1::EndKind::Unspecified),
            members: end.members.clone(),
            detail: end.detail.clone(),
        }
    }

    /// Whether it names members that were lost (rather than added, or none).
    pub fn names_losses(&self) -> bool {
        matches!(
            self.kind,
            v1::EndKind::ClosedConnection | v1::EndKind::CollectiveDeadline | v1::EndKind::Heartbeat
        )
    }

    /// Adds `member` to a cause of `kind`; a loss replaces an addition (the
    /// world must re-form without the lost one whatever else happened).
    pub fn merge(cause: &mut Option<GenerationEnding>, kind: v1::EndKind, member: &str) {
        match cause {
            Some(c) if c.kind == kind => {
                if !c.members.iter().any(|m| m == member) {
                    c.members.push(member.to_string());
                }
            }
            Some(c) if c.names_losses() && kind == v1::EndKind::MemberAdded => {}
            _ => *cause = Some(GenerationEnding::of(kind, &[member])),
        }
    }
}

/// One member of a generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its stable id.
    pub member_id: String,
    /// Its data-plane address.
    pub address: String,
    /// Its host.
    pub host: String,
    /// Its rank, once the generation runs.
    pub rank: Option<usize>,
    /// Whether it has left (without an error).
    pub left: bool,
}

/// One world of an elastic run.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// 1, 2, ...
    pub number: i64,
    /// Forming, running or ended.
    pub state: GenerationState,
    /// In join order while forming, by rank once running.
    pub members: Vec<Member>,
    /// The highest step a member brought when it joined.
    pub first_step: i64,
    /// The highest step members reported re-joining after it or leaving it.
    pub last_step: i64,
    /// Members named lost (by a re-joiner's cause or the watchdog): the next
    /// generation does not wait for them.
    pub lost: BTreeSet<String>,
    /// While it runs: why a newer generation forms (members added or lost).
    pub reform: Option<GenerationEnding>,
    /// Why it ended.
    pub end: Option<GenerationEnding>,
    /// Unix milliseconds it started running (0: not yet).
    pub started_ms: i64,
    /// Unix milliseconds it ended (0: not yet).
    pub ended_ms: i64,
    /// How long it waits for more members once it has `min_size`, since its last join.
    pub settle: Duration,
    /// Its last join (or when a restarted coordinator resumed it).
    pub last_join: Instant,
}

impl Generation {
    /// A new generation `number`, forming since `now`, with no members.
    pub fn forming(number: i64, now: Instant) -> Generation {
        Generation {
            number,
            state: GenerationState::Forming,
            members: Vec::new(),
            first_step: 0,
            last_step: 0,
            lost: BTreeSet::new(),
            reform: None,
            end: None,
            started_ms: 0,
            ended_ms: 0,
            settle: DEFAULT_SETTLE,
            last_join: now,
        }
    }

    /// Its member `member_id`, if it has one.
    pub fn member(&self, member_id: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.member_id == member_id)
    }

    /// Its number of members.
    pub fn world_size(&self) -> usize {
        self.members.len()
    }

    /// Whether it has started (running or ended after running: its members have ranks).
    pub fn has_run(&self) -> bool {
        self.started_ms > 0 || self.members.iter().any(|m| m.rank.is_some())
    }

    /// Its members' ids, in its order.
    pub fn ids(&self) -> Vec<String> {
        self.members.iter().map(|m| m.member_id.clone()).collect()
    }

    /// Ends it with `end` at `now_ms` (Unix milliseconds).
    pub fn finish(&mut self, end: GenerationEnding, now_ms: i64) {
        self.state = GenerationState::Ended;
        self.end = Some(end);
        self.ended_ms = now_ms;
    }

    /// As the Generations RPC answers it.
    pub fn to_proto(&self) -> v1::Generation {
        v1::Generation {
            number: self.number,
            state: v1::GenerationState::from(self.state).into(),
            members: self
                .members
                .iter()
                .map(|m| v1::GenerationMember {
                    member_id: m.member_id.clone(),
                    rank: m.rank.map_or(-1, |r| r as i32),
                    host: m.host.clone(),
                    address: m.address.clone(),
                })
                .collect(),
            world_size: if self.has_run() { self.world_size() as i32 } else { 0 },
            first_step: self.first_step,
            last_step: self.last_step,
            end: self.end.as_ref().map(GenerationEnding::to_proto),
            started_ms: self.started_ms,
            ended_ms: self.ended_ms,
        }
    }
}

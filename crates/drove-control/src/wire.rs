//! Conversions between drove-collective's vocabulary and the proto's.

use drove_collective::{Loss, Rank, ReformCause};
use drove_proto::v1::{EndKind, GenerationEnd};

/// A cause as the wire carries it.
pub(crate) fn cause_to_wire(cause: &ReformCause) -> GenerationEnd {
    let kind = match cause.kind {
        Loss::ClosedConnection => EndKind::ClosedConnection,
        Loss::Deadline => EndKind::CollectiveDeadline,
        Loss::Heartbeat => EndKind::Heartbeat,
        Loss::MemberAdded => EndKind::MemberAdded,
    };
    GenerationEnd { kind: kind.into(), members: cause.members.clone(), detail: cause.detail.clone() }
}

pub(crate) fn cause_from_wire(end: &GenerationEnd) -> ReformCause {
    let kind = match EndKind::try_from(end.kind).unwrap_or(EndKind::Unspecified) {
        EndKind::CollectiveDeadline => Loss::Deadline,
        EndKind::Heartbeat => Loss::Heartbeat,
        EndKind::MemberAdded => Loss::MemberAdded,
        _ => Loss::ClosedConnection,
    };
    ReformCause { kind, members: end.members.clone(), detail: end.detail.clone() }
}

/// A world size as the protocol's `int32`.
pub(crate) fn wire_size(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A rank as the protocol's `int32` (world sizes past `i32::MAX` cannot join).
pub(crate) fn wire_rank(rank: Rank) -> i32 {
    i32::try_from(rank.get()).unwrap_or(i32::MAX)
}

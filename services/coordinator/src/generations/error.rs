//! What the run's generations refuse, and the gRPC code each is answered with.

use super::MAX_LOSSES_IN_A_ROW;

/// A join, heartbeat or leave the run's generations refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GenerationError {
    /// The join's sizes are not the run's.
    #[error(
        "member {member:?} joins run {run:?} with min_size {found_min}, max_size {found_max}, but the run takes min_size {min}, max_size {max}: every join must agree"
    )]
    SizesDisagree {
        /// Run.
        run: String,
        /// Member.
        member: String,
        /// The run's sizes.
        min: usize,
        /// The run's sizes.
        max: usize,
        /// The join's sizes.
        found_min: usize,
        /// The join's sizes.
        found_max: usize,
    },
    /// The join names a generation the run has not reached.
    #[error(
        "member {member:?} joins run {run:?} after_generation {after}, but the run's newest generation is {newest}"
    )]
    FutureGeneration {
        /// Run.
        run: String,
        /// Member.
        member: String,
        /// What the join said.
        after: i64,
        /// The run's newest generation (0: none).
        newest: i64,
    },
    /// Two live members claim one id.
    #[error(
        "member {member:?} is already in generation {generation} of run {run:?} from {address}; a join from {found} claims the same id"
    )]
    AlreadyIn {
        /// Run.
        run: String,
        /// Member.
        member: String,
        /// The forming generation.
        generation: i64,
        /// The address it joined from.
        address: String,
        /// The other join's address.
        found: String,
    },
    /// The forming generation has `max_size` members.
    #[error(
        "generation {generation} of run {run:?} is full: it has max_size {max} members, member {member:?} cannot join"
    )]
    Full {
        /// Run.
        run: String,
        /// Member.
        member: String,
        /// The forming generation.
        generation: i64,
        /// The run's max_size.
        max: usize,
    },
    /// The world re-formed without the member.
    #[error(
        "member {member:?} was left out of run {run:?}: generation {formed} formed without it (it was last in generation {last})"
    )]
    LeftOut {
        /// Run.
        run: String,
        /// Member.
        member: String,
        /// The generation that formed without it.
        formed: i64,
        /// The generation it says it was last in.
        last: i64,
    },
    /// The member was lost in [`MAX_LOSSES_IN_A_ROW`] of its generations in a row.
    #[error(
        "member {member:?} is left out of run {run:?}: it was lost in {} of its generations in a row ({generations:?}), and a member lost {MAX_LOSSES_IN_A_ROW} times in a row does not join again",
        generations.len()
    )]
    Excluded {
        /// Run.
        run: String,
        /// Member.
        member: String,
        /// The generations it was lost in, oldest first.
        generations: Vec<i64>,
    },
    /// A heartbeat or leave of a member the run does not have.
    #[error("member {member:?} is in no generation of run {run:?} (expected a member that joined it)")]
    NotAMember {
        /// Run.
        run: String,
        /// Member.
        member: String,
    },
}

impl GenerationError {
    /// The gRPC code it is answered with.
    pub fn code(&self) -> tonic::Code {
        match self {
            GenerationError::SizesDisagree { .. } | GenerationError::FutureGeneration { .. } => {
                tonic::Code::InvalidArgument
            }
            GenerationError::AlreadyIn { .. } => tonic::Code::AlreadyExists,
            GenerationError::Full { .. } => tonic::Code::ResourceExhausted,
            GenerationError::LeftOut { .. } | GenerationError::Excluded { .. } => {
                tonic::Code::FailedPrecondition
            }
            GenerationError::NotAMember { .. } => tonic::Code::NotFound,
        }
    }
}

//! Request checks shared by the services; messages name the field at fault.

use tonic::Status;

/// A run id must be non-empty and at most 128 characters.
pub fn check_run_id(run_id: &str, field: &str) -> Result<(), Status> {
    if run_id.is_empty() {
        return Err(Status::invalid_argument(format!("{field} must not be empty")));
    }
    if run_id.len() > 128 {
        return Err(Status::invalid_argument(format!(
            "{field} is {} characters long, more than 128",
            run_id.len()
        )));
    }
    Ok(())
}

/// The most workers a run may have: a run's tables are sized by its world size
/// when the first worker joins, so a larger one is refused rather than allocated.
pub const MAX_WORLD_SIZE: i32 = 1 << 16;

/// A world size must be 1 to [`MAX_WORLD_SIZE`].
pub fn check_world_size(world_size: i32, field: &str) -> Result<(), Status> {
    if !(1..=MAX_WORLD_SIZE).contains(&world_size) {
        return Err(Status::invalid_argument(format!(
            "{field} must be 1 to {MAX_WORLD_SIZE}, found {world_size}"
        )));
    }
    Ok(())
}

/// `rank` as an index into a run of `world` workers, if it is one (`0..world`).
pub fn rank_in(rank: i32, world: usize) -> Option<usize> {
    usize::try_from(rank).ok().filter(|&r| r < world)
}

/// A rank of a run of `world` workers, named `field` in the error if it is
/// not one.
pub fn check_rank(rank: i32, world: usize, field: &str) -> Result<usize, Status> {
    rank_in(rank, world).ok_or_else(|| {
        Status::invalid_argument(format!("{field} {rank} is out of range for world size {world}"))
    })
}

/// A store failure, reported without leaking internals beyond the message.
pub fn internal(e: impl std::fmt::Display) -> Status {
    tracing::error!("{e}");
    Status::internal(e.to_string())
}

//! The world and the rank a process asks for, from drove's launch variables
//! (moved here from drove-comm: the launch contract is read only in this
//! crate).

use drove_collective::{CommError, Place, Rank, WorldSize};
use drove_comm::RankRequest;

use crate::var;

pub(crate) fn parse_usize(name: &str, value: Option<String>) -> Result<usize, CommError> {
    let value = value.ok_or_else(|| CommError::Rendezvous(format!("{name} is not set")))?;
    value.trim().parse().map_err(|_| CommError::Rendezvous(format!("{name}={value:?} is not a whole number")))
}

/// The world size and the rank this process asks for, from a launcher's
/// variables: `DROVE_WORLD_SIZE` (required, at least 1) and `DROVE_RANK`, or,
/// in a Kubernetes Indexed Job, `JOB_COMPLETION_INDEX` (so that a restarted pod
/// keeps its rank). Neither rank variable: any free rank
/// ([`RankRequest::Any`]). `lookup` reads a variable (the process environment
/// in [`launch_env`]).
pub fn launch_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<RankRequest, CommError> {
    let world = parse_usize(var::WORLD_SIZE, lookup(var::WORLD_SIZE))?;
    let world = WorldSize::new(world).map_err(|_| {
        CommError::Rendezvous("DROVE_WORLD_SIZE=\"0\": the world needs at least 1 rank".into())
    })?;
    let named = |name: &str| lookup(name).map(|v| parse_usize(name, Some(v)).map(|r| (name.to_string(), r)));
    let rank = match (named(var::RANK).transpose()?, named(var::JOB_COMPLETION_INDEX).transpose()?) {
        (Some((_, a)), Some((_, b))) if a != b => {
            return Err(CommError::Rendezvous(format!(
                "DROVE_RANK={a} and JOB_COMPLETION_INDEX={b} disagree: set one, or the same rank in both"
            )));
        }
        (Some(r), _) | (None, Some(r)) => Some(r),
        (None, None) => None,
    };
    let Some((name, r)) = rank else { return Ok(RankRequest::Any(world)) };
    let place = Place::of(Rank::new(r), world).map_err(|_| {
        CommError::Rendezvous(format!(
            "{name}={r} is out of range for DROVE_WORLD_SIZE={world} (ranks are 0..{world})"
        ))
    })?;
    Ok(RankRequest::Given(place))
}

/// [`launch_vars`] from this process's environment.
pub fn launch_env() -> Result<RankRequest, CommError> {
    launch_vars(|name| std::env::var(name).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn launch_variables_give_the_world_and_the_requested_rank() {
        let ok = |pairs: &[(&str, &str)]| {
            let request = launch_vars(vars(pairs)).unwrap();
            (request.world().get(), request.rank().map(Rank::get))
        };
        assert_eq!(ok(&[("DROVE_WORLD_SIZE", "4")]), (4, None));
        assert_eq!(ok(&[("DROVE_WORLD_SIZE", "4"), ("DROVE_RANK", "2")]), (4, Some(2)));
        assert_eq!(ok(&[("DROVE_WORLD_SIZE", " 4 "), ("JOB_COMPLETION_INDEX", "3")]), (4, Some(3)));
        assert_eq!(
            ok(&[("DROVE_WORLD_SIZE", "4"), ("DROVE_RANK", "1"), ("JOB_COMPLETION_INDEX", "1")]),
            (4, Some(1))
        );
    }

    #[test]
    fn missing_or_malformed_launch_variables_are_named() {
        let err = |pairs: &[(&str, &str)]| launch_vars(vars(pairs)).unwrap_err().to_string();
        assert_eq!(err(&[]), "rendezvous: DROVE_WORLD_SIZE is not set");
        assert_eq!(
            err(&[("DROVE_WORLD_SIZE", "four")]),
            "rendezvous: DROVE_WORLD_SIZE=\"four\" is not a whole number"
        );
        assert!(err(&[("DROVE_WORLD_SIZE", "0")]).contains("at least 1 rank"));
        assert_eq!(
            err(&[("DROVE_WORLD_SIZE", "4"), ("DROVE_RANK", "-1")]),
            "rendezvous: DROVE_RANK=\"-1\" is not a whole number"
        );
        assert_eq!(
            err(&[("DROVE_WORLD_SIZE", "4"), ("JOB_COMPLETION_INDEX", "")]),
            "rendezvous: JOB_COMPLETION_INDEX=\"\" is not a whole number"
        );
        assert_eq!(
            err(&[("DROVE_WORLD_SIZE", "4"), ("JOB_COMPLETION_INDEX", "4")]),
            "rendezvous: JOB_COMPLETION_INDEX=4 is out of range for DROVE_WORLD_SIZE=4 (ranks are 0..4)"
        );
        assert!(
            err(&[("DROVE_WORLD_SIZE", "4"), ("DROVE_RANK", "1"), ("JOB_COMPLETION_INDEX", "2")])
                .contains("disagree")
        );
    }
}

//! What each rank the launcher starts is told, over what it inherits:
//! drove's variables (the launch contract, read by [`LaunchEnv`]) and, in a
//! fixed world, torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`,
//! `TORCHELASTIC_RESTART_COUNT`), so that a PyTorch program's
//! `torch.distributed.init_process_group("gloo")` (the `env://` rendezvous)
//! works unchanged under `drove run --np 4 -- python train.py`.
//!
//! Both sets describe the same world. A drove rank (`drove train ner` under
//! `drove run`) reads drove's, which win over torchrun's (see
//! [`LaunchEnv::from_lookup_elastic`]): it meets at `DROVE_COORDINATOR`, so it
//! neither serves a coordinator at `MASTER_ADDR:MASTER_PORT` nor binds that
//! port, which is left to PyTorch's store.
//!
//! An elastic launch gets none of torchrun's variables, and the ranks do not
//! inherit the launcher's own: a member's rank and world size are given by
//! each world the coordinator forms, after the process started, so a `RANK`
//! or `WORLD_SIZE` set at the start would be wrong after the first change,
//! and PyTorch's fixed `env://` world cannot follow the change anyway; even a
//! `LOCAL_RANK` alone would make programs that test for it (HuggingFace's
//! `Trainer`) start a torch.distributed world that cannot form.
//!
//! [`LaunchEnv`]: crate::LaunchEnv
//! [`LaunchEnv::from_lookup_elastic`]: crate::LaunchEnv::from_lookup_elastic

use std::net::{Ipv4Addr, TcpListener};

use crate::error::LaunchError;
use crate::var;

/// `MASTER_ADDR` for the ranks of `drove run`: they all run on this host.
pub(crate) const MASTER_HOST: &str = "127.0.0.1";

/// One start of a fixed world, as torchrun describes it to its workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TorchWorld {
    /// The ranks, all on this host.
    pub np: usize,
    /// `MASTER_PORT`: where rank 0's PyTorch store listens.
    pub master_port: u16,
    /// Restarts of the world before this start.
    pub restart_count: u32,
}

impl TorchWorld {
    /// Start `restart_count` of a world of `np` ranks, meeting at a port
    /// free now and other than `previous` (the last start's, whose store may
    /// still hold it while its killed ranks' sockets close).
    pub(crate) fn start(np: usize, restart_count: u32, previous: Option<u16>) -> Result<Self, LaunchError> {
        let master_port = free_port(previous)
            .map_err(|e| LaunchError::io("picking a free port for the ranks' MASTER_PORT", e))?;
        Ok(TorchWorld { np, master_port, restart_count })
    }

    /// The variables every rank of this world gets.
    pub(crate) fn shared_vars(&self) -> Vec<(&'static str, String)> {
        vec![
            (var::TORCH_WORLD_SIZE, self.np.to_string()),
            (var::TORCH_LOCAL_WORLD_SIZE, self.np.to_string()),
            (var::GROUP_RANK, "0".to_string()),
            (var::MASTER_ADDR, MASTER_HOST.to_string()),
            (var::MASTER_PORT, self.master_port.to_string()),
            (var::TORCHELASTIC_RESTART_COUNT, self.restart_count.to_string()),
        ]
    }
}

/// The variables rank `rank` gets over its attempt's: its place (drove's,
/// and torchrun's in a fixed world, `torch`), and an elastic member's id
/// (`member_prefix` and the slot).
pub(crate) fn rank_vars(
    rank: usize,
    torch: bool,
    member_prefix: Option<&str>,
) -> Vec<(&'static str, String)> {
    let mut vars = vec![(var::RANK, rank.to_string()), (var::LOCAL_RANK, rank.to_string())];
    if torch {
        vars.extend([(var::TORCH_RANK, rank.to_string()), (var::TORCH_LOCAL_RANK, rank.to_string())]);
    }
    if let Some(prefix) = member_prefix {
        vars.push((var::MEMBER_ID, format!("{prefix}slot-{rank}")));
    }
    vars
}

/// A TCP port free on every interface (where PyTorch's store binds it) other
/// than `avoid`. As with torchrun's own pick, the port is released before
/// rank 0 binds it.
fn free_port(avoid: Option<u16>) -> std::io::Result<u16> {
    let bind = || -> std::io::Result<(u16, TcpListener)> {
        let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        Ok((listener.local_addr()?.port(), listener))
    };
    let (port, first) = bind()?;
    if Some(port) != avoid {
        return Ok(port);
    }
    // While the first is held, the kernel cannot hand out its port again.
    let (port, _second) = bind()?;
    drop(first);
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_world_s_ranks_get_torchrun_s_variables_beside_drove_s() {
        let world = TorchWorld { np: 4, master_port: 29533, restart_count: 2 };
        assert_eq!(
            world.shared_vars(),
            vec![
                ("WORLD_SIZE", "4".to_string()),
                ("LOCAL_WORLD_SIZE", "4".to_string()),
                ("GROUP_RANK", "0".to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_string()),
                ("MASTER_PORT", "29533".to_string()),
                ("TORCHELASTIC_RESTART_COUNT", "2".to_string()),
            ]
        );
        assert_eq!(
            rank_vars(3, true, None),
            vec![
                ("DROVE_RANK", "3".to_string()),
                ("DROVE_LOCAL_RANK", "3".to_string()),
                ("RANK", "3".to_string()),
                ("LOCAL_RANK", "3".to_string()),
            ]
        );
    }

    #[test]
    fn an_elastic_member_gets_drove_s_place_and_its_id_but_none_of_torchrun_s() {
        let vars = rank_vars(1, false, Some("host.42."));
        assert_eq!(
            vars,
            vec![
                ("DROVE_RANK", "1".to_string()),
                ("DROVE_LOCAL_RANK", "1".to_string()),
                ("DROVE_MEMBER_ID", "host.42.slot-1".to_string()),
            ]
        );
        assert!(vars.iter().all(|(k, _)| !var::TORCHRUN.contains(k)), "{vars:?}");
    }

    #[test]
    fn each_start_meets_at_a_free_port_other_than_the_last_start_s() {
        let first = TorchWorld::start(2, 0, None).unwrap();
        assert!(first.master_port > 0);
        for restart in 1..8 {
            let next = TorchWorld::start(2, restart, Some(first.master_port)).unwrap();
            assert_ne!(next.master_port, first.master_port, "restart {restart}");
            assert_eq!((next.np, next.restart_count), (2, restart));
        }
    }
}

//! Which ranks share a host, and so how a world moves its data: shared memory
//! when every rank is on one host, a TCP ring when no two are, and both
//! (hierarchical) when some share a host and others do not.
//!
//! A host is a kernel and a network namespace: the boot id alone would count
//! containers and namespaces on one machine as one host, although they reach
//! each other only through their network (`CommOptions::host_id`, which
//! drove-launch reads from `DROVE_HOST_ID`, overrides it, as
//! `HOROVOD_HOSTNAME` does for Horovod). The ids travel in the mesh's
//! greeting, so every rank groups the world alike; every decision below is
//! taken from what all ranks said, so all take the same one.

use std::time::{Duration, Instant};

use crate::clock::{Clock, Deadlines};
use crate::hierarchical::HostGroup;
use crate::mesh::Mesh;
use crate::options::{CommOptions, Transport};
use crate::shm::{MAX_RANKS, Shm};
use drove_collective::CommError;

/// The world's ranks grouped by host, hosts in the order of their lowest rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hosts {
    groups: Vec<Vec<usize>>,
}

impl Hosts {
    /// Groups ranks by equal, non-empty ids (an empty id is a host of its own).
    pub fn from_ids(ids: &[String]) -> Hosts {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut keys: Vec<&str> = Vec::new();
        for (rank, id) in ids.iter().enumerate() {
            match keys.iter().position(|k| !id.is_empty() && k == id) {
                Some(g) => groups[g].push(rank),
                None => {
                    keys.push(id);
                    groups.push(vec![rank]);
                }
            }
        }
        Hosts { groups }
    }

    /// How many hosts.
    pub fn count(&self) -> usize {
        self.groups.len()
    }

    /// Whether some host has more than one rank.
    pub fn shared(&self) -> bool {
        self.groups.iter().any(|g| g.len() > 1)
    }

    /// The ranks on `rank`'s host, in rank order.
    pub fn group_of(&self, rank: usize) -> &[usize] {
        self.groups.iter().find(|g| g.contains(&rank)).expect("every rank is on a host")
    }

    /// One rank per host: the lowest.
    pub fn leaders(&self) -> Vec<usize> {
        self.groups.iter().map(|g| g[0]).collect()
    }
}

/// How a world moves its data.
pub(crate) enum Topology {
    /// The TCP ring over every rank.
    Ring,
    /// Every rank on one host: one region for the world.
    Shared(Shm),
    /// Shared memory on each host, the TCP ring among one leader per host.
    Hierarchical(HostGroup),
}

/// What the transport setting and the hosts ask for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopologyChoice {
    Ring,
    Shared,
    /// Per-host regions; `required`: fail rather than fall back to the ring.
    Hierarchical {
        required: bool,
    },
}

fn plan(transport: Transport, hosts: &Hosts, world: usize) -> TopologyChoice {
    let fits = hosts.groups.iter().all(|g| g.len() <= MAX_RANKS);
    match transport {
        Transport::Tcp => TopologyChoice::Ring,
        _ if world < 2 => TopologyChoice::Ring,
        Transport::Auto | Transport::Hierarchical if hosts.count() == 1 && fits => TopologyChoice::Shared,
        Transport::Auto if hosts.shared() && fits => TopologyChoice::Hierarchical { required: false },
        Transport::Hierarchical if hosts.shared() => TopologyChoice::Hierarchical { required: true },
        Transport::Auto | Transport::Hierarchical => TopologyChoice::Ring,
    }
}

/// Chooses the topology from the ranks' host ids (`mesh.host_ids`) and sets up
/// its shared memory: the lowest rank of each host creates a region for its
/// host and tells the others its path, and every rank reports whether it could
/// map its host's. If one could not, every rank falls back to the ring (or,
/// with [`Transport::Hierarchical`], fails naming the ranks).
pub(crate) fn setup(mesh: &mut Mesh, opts: &CommOptions, deadline: Instant) -> Result<Topology, CommError> {
    let (rank, world) = (mesh.rank, mesh.world);
    let hosts = Hosts::from_ids(&mesh.host_ids);
    let plan = plan(opts.transport, &hosts, world);
    if plan == TopologyChoice::Ring {
        if opts.transport == Transport::Hierarchical && world > 1 {
            tracing::info!("no two ranks share a host: the hierarchical all-reduce is the TCP ring");
        }
        return Ok(Topology::Ring);
    }
    let group = hosts.group_of(rank).to_vec();
    let local = group.iter().position(|&r| r == rank).expect("a rank is in its host's group");
    let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let mut clock = Clock::new("shared-memory setup".into(), &Deadlines::fixed(timeout, timeout));
    let chunk = opts.shm_chunk.max(4096) / 64 * 64;
    let frame = |text: &str| {
        let mut f = (text.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(text.as_bytes());
        f
    };
    // The lowest rank of each host with company creates its host's region.
    let mut created: Option<Shm> = None;
    let mut path = String::new();
    if local == 0 && group.len() > 1 {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let candidate = format!("/dev/shm/drove-{}-{nanos}", std::process::id());
        match Shm::open(&candidate, true, 0, group.clone(), chunk) {
            Ok(shm) => {
                path = candidate;
                created = Some(shm);
            }
            Err(e) => tracing::info!("shared memory unavailable ({e})"),
        }
    }
    let paths = mesh.all_to_all_frames(&frame(&path), &mut clock)?;
    let (mine, status) = match (created, group.len()) {
        (_, 1) => (None, String::from("ok")),
        (Some(shm), _) => (Some(shm), String::from("ok")),
        (None, _) if local == 0 => (None, String::from("could not create a region")),
        (None, _) => {
            let theirs = String::from_utf8_lossy(&paths[group[0]]).into_owned();
            if theirs.is_empty() {
                (None, format!("rank {} made no region", group[0]))
            } else {
                match Shm::open(&theirs, false, local, group.clone(), chunk) {
                    Ok(s) => (Some(s), String::from("ok")),
                    Err(e) => (None, format!("cannot open {theirs}: {e}")),
                }
            }
        }
    };
    let statuses = mesh.all_to_all_frames(&frame(&status), &mut clock)?;
    if !path.is_empty() {
        let _ = std::fs::remove_file(&path); // every rank of the host has mapped it (or given up)
    }
    let failed: Vec<String> = (0..world)
        .filter_map(|r| {
            let s =
                if r == rank { status.clone() } else { String::from_utf8_lossy(&statuses[r]).into_owned() };
            (s != "ok").then(|| format!("rank {r}: {s}"))
        })
        .collect();
    if !failed.is_empty() {
        if plan == (TopologyChoice::Hierarchical { required: true }) {
            return Err(CommError::Rendezvous(format!(
                "DROVE_COMM_TRANSPORT=hierarchical, but shared memory cannot be set up on every host: {}",
                failed.join("; ")
            )));
        }
        tracing::info!(problems = %failed.join("; "), "shared memory not usable by every rank; using TCP");
        return Ok(Topology::Ring);
    }
    Ok(match (plan, mine) {
        (TopologyChoice::Shared, Some(shm)) => Topology::Shared(shm),
        (TopologyChoice::Hierarchical { .. }, shm) => {
            Topology::Hierarchical(HostGroup::new(shm, group, hosts.leaders()))
        }
        _ => Topology::Ring,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ranks_group_by_host_in_the_order_of_their_lowest_rank() {
        let hosts = Hosts::from_ids(&ids(&["b", "a", "b", "a", "c"]));
        assert_eq!(hosts.count(), 3);
        assert_eq!(hosts.group_of(2), &[0, 2]);
        assert_eq!(hosts.group_of(3), &[1, 3]);
        assert_eq!(hosts.group_of(4), &[4]);
        assert_eq!(hosts.leaders(), vec![0, 1, 4]);
        assert!(hosts.shared());
    }

    #[test]
    fn an_unknown_host_shares_with_nobody() {
        let hosts = Hosts::from_ids(&ids(&["", "", "a"]));
        assert_eq!(hosts.count(), 3);
        assert!(!hosts.shared());
    }

    #[test]
    fn the_topology_follows_the_hosts_and_the_setting() {
        let one = Hosts::from_ids(&ids(&["a", "a", "a"]));
        let two_by_two = Hosts::from_ids(&ids(&["a", "a", "b", "b"]));
        let apart = Hosts::from_ids(&ids(&["a", "b", "c"]));
        assert_eq!(plan(Transport::Auto, &one, 3), TopologyChoice::Shared);
        assert_eq!(plan(Transport::Auto, &two_by_two, 4), TopologyChoice::Hierarchical { required: false });
        assert_eq!(
            plan(Transport::Hierarchical, &two_by_two, 4),
            TopologyChoice::Hierarchical { required: true }
        );
        assert_eq!(plan(Transport::Tcp, &two_by_two, 4), TopologyChoice::Ring);
        assert_eq!(plan(Transport::Auto, &apart, 3), TopologyChoice::Ring);
        assert_eq!(plan(Transport::Hierarchical, &apart, 3), TopologyChoice::Ring);
        assert_eq!(plan(Transport::Tcp, &one, 3), TopologyChoice::Ring);
    }
}

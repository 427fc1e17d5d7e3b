//! How ranks find each other: a small trait, with a static implementation from
//! the environment and one through a shared directory. The coordinator service
//! implements the same trait.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::CommError;

/// Every rank's data-plane address, and which one is this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTable {
    /// This rank.
    pub rank: usize,
    /// Every rank's address, in rank order.
    pub addrs: Vec<SocketAddr>,
}

/// Tells a rank who it is and where its peers listen.
pub trait Rendezvous {
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Where this rank's data-plane listener binds (port 0: any free port).
    fn bind_addr(&self) -> SocketAddr;
    /// Publishes this rank's listening address and returns the peer table,
    /// waiting at most until `deadline`.
    fn exchange(&self, listening: SocketAddr, deadline: Instant) -> Result<PeerTable, CommError>;
}

fn parse_usize(name: &str, value: Option<String>) -> Result<usize, CommError> {
    let value = value.ok_or_else(|| CommError::Rendezvous(format!("{name} is not set")))?;
    value.trim().parse().map_err(|_| CommError::Rendezvous(format!("{name}={value:?} is not a whole number")))
}

/// Parses `host:port` entries separated by `sep`; blank entries and `#` comments are skipped.
fn parse_peers(text: &str, sep: char, source: &str) -> Result<Vec<SocketAddr>, CommError> {
    text.split(sep)
        .enumerate()
        .map(|(i, a)| (i + 1, a.split('#').next().unwrap_or("").trim()))
        .filter(|(_, a)| !a.is_empty())
        .map(|(i, a)| {
            a.to_socket_addrs().ok().and_then(|mut it| it.next()).ok_or_else(|| {
                CommError::Rendezvous(format!("{source} entry {i} ({a:?}) is not a host:port address"))
            })
        })
        .collect()
}

fn check_world(rank: usize, world: usize) -> Result<(), CommError> {
    if world == 0 {
        return Err(CommError::Rendezvous("world size must be at least 1, found 0".into()));
    }
    if rank >= world {
        return Err(CommError::Rendezvous(format!("rank {rank} is out of range for world size {world}")));
    }
    Ok(())
}

/// A fixed address table: rank `r` listens on `peers[r]`.
///
/// From the environment: `DROVE_RANK`, `DROVE_WORLD_SIZE` and `DROVE_PEERS`
/// (comma-separated `host:port`, one per rank, in rank order), or
/// `DROVE_PEERS_FILE` (a file with one `host:port` per line, `#` comments).
#[derive(Clone, Debug)]
pub struct StaticRendezvous {
    rank: usize,
    peers: Vec<SocketAddr>,
}

impl StaticRendezvous {
    /// A table given directly.
    pub fn new(rank: usize, peers: Vec<SocketAddr>) -> Result<Self, CommError> {
        check_world(rank, peers.len())?;
        Ok(StaticRendezvous { rank, peers })
    }

    /// Reads `DROVE_RANK`, `DROVE_WORLD_SIZE` and `DROVE_PEERS` or `DROVE_PEERS_FILE`.
    pub fn from_env() -> Result<Self, CommError> {
        let rank = parse_usize("DROVE_RANK", std::env::var("DROVE_RANK").ok())?;
        let world = parse_usize("DROVE_WORLD_SIZE", std::env::var("DROVE_WORLD_SIZE").ok())?;
        let (source, peers) = if let Ok(file) = std::env::var("DROVE_PEERS_FILE") {
            let text =
                std::fs::read_to_string(&file).map_err(|e| CommError::io(format!("reading {file}"), e))?;
            let peers = parse_peers(&text, '\n', "DROVE_PEERS_FILE")?;
            (file, peers)
        } else {
            let list = std::env::var("DROVE_PEERS").map_err(|_| {
                CommError::Rendezvous("neither DROVE_PEERS nor DROVE_PEERS_FILE is set".into())
            })?;
            ("DROVE_PEERS".to_string(), parse_peers(&list, ',', "DROVE_PEERS")?)
        };
        if peers.len() != world {
            return Err(CommError::Rendezvous(format!(
                "{source} lists {} addresses but DROVE_WORLD_SIZE is {world}",
                peers.len()
            )));
        }
        Self::new(rank, peers)
    }
}

impl Rendezvous for StaticRendezvous {
    fn world_size(&self) -> usize {
        self.peers.len()
    }
    fn bind_addr(&self) -> SocketAddr {
        self.peers[self.rank]
    }
    fn exchange(&self, _listening: SocketAddr, _deadline: Instant) -> Result<PeerTable, CommError> {
        Ok(PeerTable { rank: self.rank, addrs: self.peers.clone() })
    }
}

/// Rendezvous through a directory all ranks can see: each rank binds a free
/// loopback port and writes its address to `DIR/rank-R.addr` (atomically), then
/// waits for the others' files. For tests and single-host launchers.
#[derive(Clone, Debug)]
pub struct FileRendezvous {
    dir: PathBuf,
    rank: usize,
    world: usize,
    bind: SocketAddr,
}

impl FileRendezvous {
    /// Rank `rank` of `world`, exchanging through `dir`, listening on 127.0.0.1.
    pub fn new(dir: impl AsRef<Path>, rank: usize, world: usize) -> Result<Self, CommError> {
        check_world(rank, world)?;
        Ok(FileRendezvous {
            dir: dir.as_ref().to_path_buf(),
            rank,
            world,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
        })
    }

    /// Reads `DROVE_RANK`, `DROVE_WORLD_SIZE` and `DROVE_RENDEZVOUS_DIR`.
    pub fn from_env() -> Result<Self, CommError> {
        let rank = parse_usize("DROVE_RANK", std::env::var("DROVE_RANK").ok())?;
        let world = parse_usize("DROVE_WORLD_SIZE", std::env::var("DROVE_WORLD_SIZE").ok())?;
        let dir = std::env::var("DROVE_RENDEZVOUS_DIR")
            .map_err(|_| CommError::Rendezvous("DROVE_RENDEZVOUS_DIR is not set".into()))?;
        Self::new(dir, rank, world)
    }
}

impl Rendezvous for FileRendezvous {
    fn world_size(&self) -> usize {
        self.world
    }
    fn bind_addr(&self) -> SocketAddr {
        self.bind
    }
    fn exchange(&self, listening: SocketAddr, deadline: Instant) -> Result<PeerTable, CommError> {
        let io = |what: String| move |e: std::io::Error| CommError::io(what, e);
        std::fs::create_dir_all(&self.dir).map_err(io(format!("creating {}", self.dir.display())))?;
        let file = |r: usize| self.dir.join(format!("rank-{r}.addr"));
        let tmp = self.dir.join(format!(".rank-{}.addr.{}", self.rank, std::process::id()));
        std::fs::write(&tmp, listening.to_string()).map_err(io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, file(self.rank))
            .map_err(io(format!("publishing {}", file(self.rank).display())))?;
        let mut addrs: Vec<Option<SocketAddr>> = vec![None; self.world];
        let mut backoff = Duration::from_millis(1);
        loop {
            for (r, slot) in addrs.iter_mut().enumerate() {
                if slot.is_none()
                    && let Ok(text) = std::fs::read_to_string(file(r))
                {
                    let addr = text.trim().parse().map_err(|_| {
                        CommError::Rendezvous(format!("{} holds {text:?}, not an address", file(r).display()))
                    })?;
                    *slot = Some(addr);
                }
            }
            let missing: Vec<usize> = (0..self.world).filter(|&r| addrs[r].is_none()).collect();
            if missing.is_empty() {
                let addrs = addrs.into_iter().map(|a| a.expect("all present")).collect();
                return Ok(PeerTable { rank: self.rank, addrs });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CommError::Rendezvous(format!(
                    "rank(s) {missing:?} never published an address in {}",
                    self.dir.display()
                )));
            }
            // Polling a directory: bounded by the deadline, backing off to 50 ms.
            std::thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_lists_parse_with_comments_and_name_bad_entries() {
        let peers = parse_peers("127.0.0.1:1000\n# rank 1\n127.0.0.1:1001  # second\n\n", '\n', "f").unwrap();
        assert_eq!(peers, vec!["127.0.0.1:1000".parse().unwrap(), "127.0.0.1:1001".parse().unwrap()]);
        let err = parse_peers("127.0.0.1:1,nonsense", ',', "DROVE_PEERS").unwrap_err().to_string();
        assert!(err.contains("DROVE_PEERS entry 2 (\"nonsense\")"), "{err}");
        assert!(StaticRendezvous::new(2, peers).unwrap_err().to_string().contains("rank 2 is out of range"));
    }
}

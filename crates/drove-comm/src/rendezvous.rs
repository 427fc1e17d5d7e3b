//! How ranks find each other: a small trait, with a static implementation (a
//! fixed table) and one through a shared directory. drove-control's
//! coordinator rendezvous implements the same trait; drove-launch builds each
//! from the launch environment.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use drove_collective::CommError;
use drove_collective::{Place, PlaceError, Rank, WorldSize};

/// Every rank's data-plane address, and which one is this rank: its place is
/// in a world of as many ranks as there are addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerTable {
    place: Place,
    addrs: Vec<SocketAddr>,
}

impl PeerTable {
    /// The table of `addrs` (rank order) as seen by `rank`; an error if there
    /// are no addresses or `rank` has none.
    pub fn new(rank: Rank, addrs: Vec<SocketAddr>) -> Result<PeerTable, PlaceError> {
        let place = Place::of(rank, WorldSize::new(addrs.len())?)?;
        Ok(PeerTable { place, addrs })
    }

    /// This rank, in its world.
    pub fn place(&self) -> Place {
        self.place
    }

    /// Every rank's address, in rank order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// This rank's own address.
    pub fn own_addr(&self) -> SocketAddr {
        self.addrs[self.place.rank().get()]
    }
}

/// Tells a rank who it is and where its peers listen.
pub trait Rendezvous {
    /// Number of ranks.
    fn world_size(&self) -> WorldSize;
    /// Where this rank's data-plane listener binds (port 0: any free port).
    fn bind_addr(&self) -> SocketAddr;
    /// Publishes this rank's listening address and returns the peer table,
    /// waiting at most until `deadline`.
    fn exchange(&self, listening: SocketAddr, deadline: Instant) -> Result<PeerTable, CommError>;
}

/// The place a process asks for in its world: a given rank, or any free one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankRequest {
    /// Any free rank of a world of this size.
    Any(WorldSize),
    /// This rank, in its world.
    Given(Place),
}

impl RankRequest {
    /// The world asked to join.
    pub fn world(self) -> WorldSize {
        match self {
            RankRequest::Any(world) => world,
            RankRequest::Given(place) => place.world(),
        }
    }

    /// The rank asked for, if one is.
    pub fn rank(self) -> Option<Rank> {
        match self {
            RankRequest::Any(_) => None,
            RankRequest::Given(place) => Some(place.rank()),
        }
    }
}

/// Parses `host:port` entries separated by `sep` (`,` in a list, `\n` in a
/// file); blank entries and `#` comments are skipped. `source` names the list
/// in errors (entry numbers count from 1).
pub fn parse_peers(text: &str, sep: char, source: &str) -> Result<Vec<SocketAddr>, CommError> {
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

/// A fixed address table: rank `r` listens on `peers[r]` (drove-launch
/// builds one from `DROVE_PEERS` or `DROVE_PEERS_FILE`, read with
/// [`parse_peers`]).
#[derive(Clone, Debug)]
pub struct StaticRendezvous {
    table: PeerTable,
}

impl StaticRendezvous {
    /// A table given directly: `rank` listens on `peers[rank]`.
    pub fn new(rank: Rank, peers: Vec<SocketAddr>) -> Result<Self, CommError> {
        Ok(StaticRendezvous { table: PeerTable::new(rank, peers)? })
    }
}

impl Rendezvous for StaticRendezvous {
    fn world_size(&self) -> WorldSize {
        self.table.place().world()
    }
    fn bind_addr(&self) -> SocketAddr {
        self.table.own_addr()
    }
    fn exchange(&self, _listening: SocketAddr, _deadline: Instant) -> Result<PeerTable, CommError> {
        Ok(self.table.clone())
    }
}

/// Rendezvous through a directory all ranks can see: each rank binds a free
/// loopback port and writes its address to `DIR/rank-R.addr` (atomically), then
/// waits for the others' files. For tests and single-host launchers.
#[derive(Clone, Debug)]
pub struct FileRendezvous {
    dir: PathBuf,
    place: Place,
    bind: SocketAddr,
}

impl FileRendezvous {
    /// The rank at `place`, exchanging through `dir`, listening on 127.0.0.1.
    pub fn new(dir: impl AsRef<Path>, place: Place) -> Self {
        FileRendezvous { dir: dir.as_ref().to_path_buf(), place, bind: SocketAddr::from(([127, 0, 0, 1], 0)) }
    }
}

impl Rendezvous for FileRendezvous {
    fn world_size(&self) -> WorldSize {
        self.place.world()
    }
    fn bind_addr(&self) -> SocketAddr {
        self.bind
    }
    fn exchange(&self, listening: SocketAddr, deadline: Instant) -> Result<PeerTable, CommError> {
        let io = |what: String| move |e: std::io::Error| CommError::io(what, e);
        std::fs::create_dir_all(&self.dir).map_err(io(format!("creating {}", self.dir.display())))?;
        let (rank, world) = (self.place.rank().get(), self.place.world().get());
        let file = |r: usize| self.dir.join(format!("rank-{r}.addr"));
        let tmp = self.dir.join(format!(".rank-{rank}.addr.{}", std::process::id()));
        std::fs::write(&tmp, listening.to_string()).map_err(io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, file(rank)).map_err(io(format!("publishing {}", file(rank).display())))?;
        let mut addrs: Vec<Option<SocketAddr>> = vec![None; world];
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
            let missing: Vec<usize> = (0..world).filter(|&r| addrs[r].is_none()).collect();
            if missing.is_empty() {
                let addrs = addrs.into_iter().map(|a| a.expect("all present")).collect();
                return Ok(PeerTable { place: self.place, addrs });
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
        assert!(
            StaticRendezvous::new(Rank::new(2), peers)
                .unwrap_err()
                .to_string()
                .contains("rank 2 is out of range")
        );
    }
}

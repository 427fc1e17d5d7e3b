//! How ranks find each other: a small trait, with a static implementation from
//! the environment and one through a shared directory. The coordinator service
//! implements the same trait.

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

fn parse_usize(name: &str, value: Option<String>) -> Result<usize, CommError> {
    let value = value.ok_or_else(|| CommError::Rendezvous(format!("{name} is not set")))?;
    value.trim().parse().map_err(|_| CommError::Rendezvous(format!("{name}={value:?} is not a whole number")))
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

/// The world size and the rank this process asks for, from a launcher's
/// variables: `DROVE_WORLD_SIZE` (required, at least 1) and `DROVE_RANK`, or,
/// in a Kubernetes Indexed Job, `JOB_COMPLETION_INDEX` (so that a restarted pod
/// keeps its rank). Neither rank variable: any free rank
/// ([`RankRequest::Any`]). `lookup` reads a variable (the process environment
/// in [`launch_env`]).
pub fn launch_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<RankRequest, CommError> {
    let world = parse_usize("DROVE_WORLD_SIZE", lookup("DROVE_WORLD_SIZE"))?;
    let world = WorldSize::new(world).map_err(|_| {
        CommError::Rendezvous("DROVE_WORLD_SIZE=\"0\": the world needs at least 1 rank".into())
    })?;
    let named = |name: &str| lookup(name).map(|v| parse_usize(name, Some(v)).map(|r| (name.to_string(), r)));
    let rank = match (named("DROVE_RANK").transpose()?, named("JOB_COMPLETION_INDEX").transpose()?) {
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

/// A fixed address table: rank `r` listens on `peers[r]`.
///
/// From the environment: `DROVE_RANK`, `DROVE_WORLD_SIZE` and `DROVE_PEERS`
/// (comma-separated `host:port`, one per rank, in rank order), or
/// `DROVE_PEERS_FILE` (a file with one `host:port` per line, `#` comments).
#[derive(Clone, Debug)]
pub struct StaticRendezvous {
    table: PeerTable,
}

impl StaticRendezvous {
    /// A table given directly: `rank` listens on `peers[rank]`.
    pub fn new(rank: Rank, peers: Vec<SocketAddr>) -> Result<Self, CommError> {
        Ok(StaticRendezvous { table: PeerTable::new(rank, peers)? })
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
        Self::new(Rank::new(rank), peers)
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

    /// Reads `DROVE_RANK`, `DROVE_WORLD_SIZE` and `DROVE_RENDEZVOUS_DIR`.
    pub fn from_env() -> Result<Self, CommError> {
        let rank = parse_usize("DROVE_RANK", std::env::var("DROVE_RANK").ok())?;
        let world = parse_usize("DROVE_WORLD_SIZE", std::env::var("DROVE_WORLD_SIZE").ok())?;
        let dir = std::env::var("DROVE_RENDEZVOUS_DIR")
            .map_err(|_| CommError::Rendezvous("DROVE_RENDEZVOUS_DIR is not set".into()))?;
        Ok(Self::new(dir, Place::new(rank, world)?))
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

//! The launch environment: every variable a launcher (`drove run`, a
//! Kubernetes Indexed Job, `mpirun`, `srun`, torchrun, a script) hands a
//! rank, read once into a type.
//!
//! The names are constants in [`var`], so the launcher that writes them and the
//! rank that reads them cannot drift apart. A malformed value is an error
//! naming the variable and what it holds; a missing one is `None` where the
//! contract allows it (a process started by hand is a world of one).
//!
//! # Whose variables win
//!
//! A process may carry several launchers' variables: `drove run` gives its
//! ranks torchrun's beside drove's (so that PyTorch programs run under it
//! unchanged), and a shell may hold stale ones. The rule has two parts:
//!
//! 1. **The place** (rank, world, local rank, run id): drove's when
//!    `DROVE_WORLD_SIZE` is set, and then no other launcher's variable is
//!    read, not even checked: torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!    `MASTER_ADDR` and `MASTER_PORT` beside drove's change nothing, whatever
//!    they hold. Without it, another launcher's (see [`launchers`]); a
//!    `DROVE_RANK` beside that without `DROVE_WORLD_SIZE` is an error rather
//!    than silently outvoted. An elastic member takes its place from no
//!    launcher: each world the coordinator forms gives it one.
//! 2. **The meeting place**: drove's rendezvous variables
//!    (`DROVE_COORDINATOR`, `DROVE_RENDEZVOUS_DIR`, `DROVE_PEERS`,
//!    `DROVE_PEERS_FILE`) when any is set. Only without them, and only for
//!    a process another launcher placed, do `MASTER_ADDR:MASTER_PORT` (or a
//!    Slurm job's first host) name a coordinator that rank 0 serves. So a
//!    drove rank under `drove run` never binds `MASTER_PORT`: that port is
//!    PyTorch's store's.
//!
//! [`launchers`]: crate::rank::foreign

use std::path::PathBuf;
use std::time::Duration;

use drove_collective::{Rank, WorldRange, WorldSize};
use drove_comm::{CommOptions, RankRequest, Transport};

use crate::error::EnvError;
use crate::progress::ProgressMode;
use crate::rank::foreign::{self, ForeignPlace, Launcher};
use crate::rank::nodelist;
use crate::rank::served::{CoordinatorSource, slurm_default_port};
use crate::var;

/// How the ranks find each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RendezvousKind {
    /// No launcher: a world of one.
    Alone,
    /// Through the coordinator at `DROVE_COORDINATOR`.
    Coordinator,
    /// Through files in `DROVE_RENDEZVOUS_DIR`.
    Directory,
    /// From a fixed list, `DROVE_PEERS` or `DROVE_PEERS_FILE`.
    Peers,
}

/// What a launcher told this process, read and checked once.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchEnv {
    /// The world and the rank in it, checked together: drove's
    /// (`DROVE_WORLD_SIZE` with `DROVE_RANK` or `JOB_COMPLETION_INDEX`, else
    /// any free rank), or another launcher's (see [`Launcher`]); `None` when
    /// alone, or an elastic member (each world gives it one).
    pub place: Option<RankRequest>,
    /// The launcher that placed this process, if one did.
    pub launcher: Option<Launcher>,
    /// `DROVE_LOCAL_RANK`, else the launcher's local rank (0 if neither).
    pub local_rank: usize,
    /// `DROVE_LOCAL_WORLD_SIZE`, else the launcher's, if either is set.
    pub local_world_size: Option<usize>,
    /// `DROVE_RUN_ID`, else the launcher's job (`slurm-JOB.STEP`,
    /// `openmpi-JOB`, `torchrun-ID`, a PyTorchJob's name), if either.
    pub run_id: Option<String>,
    /// The coordinator's address: `DROVE_COORDINATOR`, else, for a process
    /// another launcher placed and no other drove rendezvous set, the one
    /// rank 0 serves (`MASTER_ADDR:MASTER_PORT`, or a Slurm job's first host).
    pub coordinator: Option<String>,
    /// Where [`coordinator`](Self::coordinator) comes from, if set.
    pub coordinator_source: Option<CoordinatorSource>,
    /// `SLURMD_NODENAME`: the Slurm node this task runs on, if it is one.
    pub slurm_node: Option<String>,
    /// `DROVE_TOKEN`, if set and not empty.
    pub token: Option<String>,
    /// `DROVE_TLS_CA`: the CA file trusted for an `https://` coordinator.
    pub tls_ca: Option<PathBuf>,
    /// `DROVE_RESTART_COUNT` (0 if unset).
    pub restart_count: u32,
    /// `DROVE_PROGRESS`: who shows rank 0's progress.
    pub progress: ProgressMode,
    /// `DROVE_TIMELINE`, if set.
    pub timeline: Option<PathBuf>,
    /// How the ranks find each other.
    pub rendezvous: RendezvousKind,
    /// `DROVE_ELASTIC`: the world sizes of an elastic run, if it is one.
    pub elastic: Option<WorldRange>,
    /// `DROVE_MEMBER_ID`, if set.
    pub member_id: Option<String>,
    /// `JOB_COMPLETION_INDEX` (a Kubernetes Indexed Job's pod index), if set.
    pub job_index: Option<usize>,
    /// `DROVE_SETTLE_SECS`, if set.
    pub settle: Option<Duration>,
    /// `DROVE_RENDEZVOUS_TIMEOUT_SECS`, if set.
    pub rendezvous_timeout: Option<Duration>,
    /// `DROVE_HEARTBEAT_SECS`: how often a joined rank beats (`None`:
    /// never); [`drove_control::DEFAULT_HEARTBEAT`] when unset.
    pub heartbeat: Option<Duration>,
    /// `DROVE_METRICS_CAPACITY`, if set.
    pub metrics_capacity: Option<usize>,
    /// `DROVE_METRICS_FLUSH_SECS`, if set.
    pub metrics_flush: Option<Duration>,
    /// `DROVE_BIND`, if set.
    pub bind: Option<std::net::SocketAddr>,
    /// `DROVE_RENDEZVOUS_DIR`, if set.
    pub rendezvous_dir: Option<PathBuf>,
    /// `DROVE_PEERS`, if set: every rank's `host:port`, comma-separated.
    pub peers: Option<String>,
    /// `DROVE_PEERS_FILE`, if set (read when the communicator connects).
    pub peers_file: Option<PathBuf>,
    /// `DROVE_COMM_TIMEOUT`, if set.
    pub comm_timeout: Option<Duration>,
    /// `DROVE_COMM_WARN_AFTER`, if set.
    pub comm_warn_after: Option<Duration>,
    /// `DROVE_COMM_HANG_LIMIT`, if set.
    pub comm_hang_limit: Option<Duration>,
    /// `DROVE_COMM_TRANSPORT`, if set.
    pub transport: Option<Transport>,
    /// `DROVE_HOST_ID`, if set and not empty.
    pub host_id: Option<String>,
}

/// `DROVE_COORDINATOR` as this process's environment holds it, for a command
/// that talks to a coordinator without joining a run (`drove runs`, `drove
/// report`); a rank's coordinator is [`LaunchEnv::coordinator`].
pub fn coordinator_from_env() -> Option<String> {
    std::env::var(var::COORDINATOR).ok()
}

/// `DROVE_TOKEN` from this process's environment, if set and not empty.
pub fn token_from_env() -> Option<String> {
    std::env::var(var::TOKEN).ok().filter(|t| !t.is_empty())
}

impl LaunchEnv {
    /// Reads this process's environment.
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the variables through `lookup` (a map in tests, the process
    /// environment in [`from_env`](Self::from_env)).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        Self::from_lookup_elastic(lookup, None)
    }

    /// Reads this process's environment for a member of an elastic run of
    /// `world` sizes when given (a command's `--world`, which wins over
    /// `DROVE_ELASTIC`): then no world size is needed.
    pub fn from_env_elastic(world: Option<WorldRange>) -> Result<Self, EnvError> {
        Self::from_lookup_elastic(|name| std::env::var(name).ok(), world)
    }

    /// [`from_lookup`](Self::from_lookup) with an elastic run's sizes given.
    pub fn from_lookup_elastic(
        lookup: impl Fn(&str) -> Option<String>,
        world: Option<WorldRange>,
    ) -> Result<Self, EnvError> {
        let read = Reader(&lookup);
        let elastic = match world {
            Some(range) => Some(range),
            None => read.elastic()?,
        };
        // Rule 1 (see the module's docs): drove's place, else another launcher's.
        let drove_world = read.text(var::WORLD_SIZE).is_some();
        let foreign = if drove_world { None } else { read.foreign(&lookup, elastic.is_some())? };
        let (place, launcher) = if drove_world {
            let place = crate::place::launch_vars(&lookup).map_err(|e| EnvError::Place(e.to_string()))?;
            let by_index = read.text(var::RANK).is_none() && read.text(var::JOB_COMPLETION_INDEX).is_some();
            (Some(place), Some(if by_index { Launcher::IndexedJob } else { Launcher::Drove }))
        } else {
            match foreign.filter(|_| elastic.is_none()) {
                Some(p) => (Some(RankRequest::Given(p.place)), Some(p.launcher)),
                None => (None, None),
            }
        };
        let (coordinator, coordinator_source) = read.coordinator(foreign.as_ref())?;
        let rendezvous = read.rendezvous(coordinator.is_some());
        if place.is_none() && elastic.is_none() && rendezvous != RendezvousKind::Alone {
            // Under a rendezvous without a world: the missing variable, named.
            crate::place::launch_vars(&lookup).map_err(|e| EnvError::Place(e.to_string()))?;
        }
        if let Some(p) = foreign.filter(|p| place.is_some() && p.place.world().get() > 1)
            && rendezvous == RendezvousKind::Alone
        {
            return Err(EnvError::Place(format!(
                "{} placed this process as rank {} of {}, but nothing says where the ranks meet: set {} \
                 (a running coordinator), or {} and {} (rank 0 serves one there)",
                p.launcher,
                p.place.rank(),
                p.place.world(),
                var::COORDINATOR,
                var::MASTER_ADDR,
                var::MASTER_PORT
            )));
        }
        Ok(LaunchEnv {
            place,
            launcher,
            local_rank: read.number(var::LOCAL_RANK)?.or(foreign.and_then(|p| p.local_rank)).unwrap_or(0),
            local_world_size: read
                .number(var::LOCAL_WORLD_SIZE)?
                .or(foreign.and_then(|p| p.local_world_size)),
            run_id: read.text(var::RUN_ID).or_else(|| read.job_run_id(launcher)),
            coordinator,
            coordinator_source,
            slurm_node: read.text(var::SLURMD_NODENAME),
            token: read.text(var::TOKEN),
            tls_ca: read.text(var::TLS_CA).map(PathBuf::from),
            restart_count: read.number(var::RESTART_COUNT)?.unwrap_or(0),
            progress: read.progress()?,
            timeline: read.text(var::TIMELINE).map(PathBuf::from),
            rendezvous,
            elastic,
            member_id: read.text(var::MEMBER_ID),
            job_index: read.number(var::JOB_COMPLETION_INDEX)?,
            settle: read.seconds(var::SETTLE_SECS)?,
            rendezvous_timeout: read.seconds(var::RENDEZVOUS_TIMEOUT_SECS)?,
            heartbeat: match read.seconds(var::HEARTBEAT_SECS)? {
                None => Some(drove_control::DEFAULT_HEARTBEAT),
                Some(every) if every.is_zero() => None,
                Some(every) => Some(every),
            },
            bind: read.address(var::BIND)?,
            metrics_capacity: read.number(var::METRICS_CAPACITY)?,
            metrics_flush: read.seconds(var::METRICS_FLUSH_SECS)?,
            rendezvous_dir: read.text(var::RENDEZVOUS_DIR).map(PathBuf::from),
            peers: read.text(var::PEERS),
            peers_file: read.text(var::PEERS_FILE).map(PathBuf::from),
            comm_timeout: read.positive_seconds(var::COMM_TIMEOUT)?,
            comm_warn_after: read.positive_seconds(var::COMM_WARN_AFTER)?,
            comm_hang_limit: read.positive_seconds(var::COMM_HANG_LIMIT)?,
            transport: read.transport()?,
            host_id: read.text(var::HOST_ID),
        })
    }

    /// The communicator's settings: drove-comm's defaults, overridden by
    /// `DROVE_COMM_TIMEOUT` (which also brings the first warning to at most a
    /// third of it), `DROVE_COMM_WARN_AFTER`, `DROVE_COMM_HANG_LIMIT`,
    /// `DROVE_COMM_TRANSPORT` and `DROVE_HOST_ID`.
    pub fn comm_options(&self) -> CommOptions {
        let mut o = CommOptions::default();
        if let Some(t) = self.comm_timeout {
            o.timeout = t;
            o.warn_after = o.warn_after.min(t / 3);
        }
        if let Some(t) = self.comm_warn_after {
            o.warn_after = t;
        }
        if let Some(t) = self.comm_hang_limit {
            o.hang_limit = t;
        }
        if let Some(t) = self.transport {
            o.transport = t;
        }
        o.host_id.clone_from(&self.host_id);
        o
    }

    /// The rank the launcher gave, if it gave one.
    pub fn rank(&self) -> Option<Rank> {
        self.place.and_then(RankRequest::rank)
    }

    /// The world size the launcher gave, if it gave one.
    pub fn world_size(&self) -> Option<WorldSize> {
        self.place.map(RankRequest::world)
    }

    /// Whether a launcher started this process among others (any rendezvous is set).
    pub fn under_launcher(&self) -> bool {
        self.rendezvous != RendezvousKind::Alone
    }

    /// Whether this is a restart of the world (`DROVE_RESTART_COUNT` above 0).
    pub fn restarted(&self) -> bool {
        self.restart_count > 0
    }

    /// Whether a launcher other than drove's placed this process (then no
    /// launcher tells the coordinator that its ranks left: they do).
    pub fn placed_by_foreign_launcher(&self) -> bool {
        self.launcher.is_some_and(|l| !matches!(l, Launcher::Drove | Launcher::IndexedJob))
    }
}

/// Reads and parses single variables, naming the variable in every error.
struct Reader<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Reader<'_, F> {
    /// A variable's value, `None` if unset or blank.
    fn text(&self, name: &'static str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    /// The place another launcher gave this process (drove's own is not
    /// set): an error if `DROVE_RANK` is set beside it, unless `elastic`
    /// (then `DROVE_RANK` is the launcher's slot, not a place).
    fn foreign(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
        elastic: bool,
    ) -> Result<Option<ForeignPlace>, EnvError> {
        let foreign = foreign::detect(lookup)?;
        if let Some(p) = foreign.filter(|_| !elastic)
            && let Some(rank) = self.text(var::RANK)
        {
            return Err(EnvError::Place(format!(
                "{}={} is set without {}, beside {} placing this process as rank {} of {}: set {} too \
                 (then drove's variables win), or unset {}",
                var::RANK,
                rank.trim(),
                var::WORLD_SIZE,
                p.launcher,
                p.place.rank(),
                p.place.world(),
                var::WORLD_SIZE,
                var::RANK
            )));
        }
        Ok(foreign)
    }

    fn number<T: std::str::FromStr>(&self, name: &'static str) -> Result<Option<T>, EnvError> {
        self.text(name)
            .map(|v| {
                v.trim().parse().map_err(|_| EnvError::Malformed {
                    var: name,
                    value: v,
                    expected: "a whole number",
                })
            })
            .transpose()
    }

    fn elastic(&self) -> Result<Option<WorldRange>, EnvError> {
        self.text(var::ELASTIC)
            .map(|v| {
                v.parse().map_err(|_| EnvError::Malformed {
                    var: var::ELASTIC,
                    value: v,
                    expected: "MIN:MAX world sizes with 1 <= MIN <= MAX",
                })
            })
            .transpose()
    }

    fn seconds(&self, name: &'static str) -> Result<Option<Duration>, EnvError> {
        self.text(name)
            .map(|v| match v.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s >= 0.0 => Ok(Duration::from_secs_f64(s)),
                _ => Err(EnvError::Malformed {
                    var: name,
                    value: v,
                    expected: "a number of seconds (at least 0)",
                }),
            })
            .transpose()
    }

    fn positive_seconds(&self, name: &'static str) -> Result<Option<Duration>, EnvError> {
        self.text(name)
            .map(|v| match v.trim().parse::<f64>() {
                Ok(s) if s.is_finite() && s > 0.0 => Ok(Duration::from_secs_f64(s)),
                _ => {
                    Err(EnvError::Malformed { var: name, value: v, expected: "a positive number of seconds" })
                }
            })
            .transpose()
    }

    fn transport(&self) -> Result<Option<Transport>, EnvError> {
        self.text(var::COMM_TRANSPORT)
            .map(|v| {
                v.trim().parse().map_err(|_| EnvError::Malformed {
                    var: var::COMM_TRANSPORT,
                    value: v,
                    expected: "auto, tcp or hierarchical",
                })
            })
            .transpose()
    }

    fn address(&self, name: &'static str) -> Result<Option<std::net::SocketAddr>, EnvError> {
        self.text(name)
            .map(|v| {
                v.trim().parse().map_err(|_| EnvError::Malformed {
                    var: name,
                    value: v,
                    expected: "an address",
                })
            })
            .transpose()
    }

    fn rendezvous(&self, coordinator: bool) -> RendezvousKind {
        if coordinator {
            RendezvousKind::Coordinator
        } else if self.text(var::RENDEZVOUS_DIR).is_some() {
            RendezvousKind::Directory
        } else if self.text(var::PEERS).is_some() || self.text(var::PEERS_FILE).is_some() {
            RendezvousKind::Peers
        } else {
            RendezvousKind::Alone
        }
    }

    /// The coordinator and where it comes from (rule 2 of the module's
    /// docs): `DROVE_COORDINATOR`; else, for a process another launcher
    /// placed and no other drove rendezvous set, `MASTER_ADDR:MASTER_PORT`,
    /// or in a Slurm job the first host of its node list.
    fn coordinator(
        &self,
        foreign: Option<&ForeignPlace>,
    ) -> Result<(Option<String>, Option<CoordinatorSource>), EnvError> {
        if let Some(addr) = self.text(var::COORDINATOR) {
            return Ok((Some(addr), Some(CoordinatorSource::Given)));
        }
        // Not placed by another launcher, or drove's own rendezvous is set.
        if foreign.is_none() || self.rendezvous(false) != RendezvousKind::Alone {
            return Ok((None, None));
        }
        match (self.text(var::MASTER_ADDR), self.port(var::MASTER_PORT)?) {
            (Some(host), Some(port)) => {
                return Ok((Some(format!("{}:{port}", host.trim())), Some(CoordinatorSource::Master)));
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(EnvError::Place(format!(
                    "{} and {} go together (torchrun and PyTorchJob set both): one is set without the other",
                    var::MASTER_ADDR,
                    var::MASTER_PORT
                )));
            }
            (None, None) => {}
        }
        let Some(list) = self.text(var::SLURM_JOB_NODELIST) else { return Ok((None, None)) };
        let host = nodelist::first_host(&list)
            .map_err(|e| EnvError::Place(format!("{}: {e}", var::SLURM_JOB_NODELIST)))?;
        let port = match self.port(var::COORDINATOR_PORT)? {
            Some(port) => port,
            None => slurm_default_port(self.number(var::SLURM_JOB_ID)?.unwrap_or(0)),
        };
        Ok((Some(format!("{host}:{port}")), Some(CoordinatorSource::SlurmFirstHost)))
    }

    fn port(&self, name: &'static str) -> Result<Option<u16>, EnvError> {
        self.text(name)
            .map(|v| match v.trim().parse::<u16>() {
                Ok(p) if p > 0 => Ok(p),
                _ => Err(EnvError::Malformed { var: name, value: v, expected: "a port number (1 to 65535)" }),
            })
            .transpose()
    }

    /// The run id of `launcher`'s job, if it has one.
    fn job_run_id(&self, launcher: Option<Launcher>) -> Option<String> {
        match launcher? {
            Launcher::Slurm => {
                let job = self.text(var::SLURM_JOB_ID)?;
                Some(match self.text(var::SLURM_STEP_ID) {
                    Some(step) => format!("slurm-{}.{}", job.trim(), step.trim()),
                    None => format!("slurm-{}", job.trim()),
                })
            }
            Launcher::OpenMpi => self.text(var::OMPI_JOB_ID).map(|id| format!("openmpi-{}", id.trim())),
            Launcher::Torchrun => {
                if let Some(id) = self.text(var::TORCHELASTIC_RUN_ID).filter(|id| id.trim() != "none") {
                    return Some(format!("torchrun-{}", id.trim()));
                }
                let (host, port) = (self.text(var::MASTER_ADDR)?, self.text(var::MASTER_PORT)?);
                // A PyTorchJob's master is `NAME-master-0`: its ranks run as job NAME.
                match host.trim().strip_suffix("-master-0") {
                    Some(job) if !job.is_empty() => Some(job.to_string()),
                    _ => Some(format!("torchrun-{}-{}", host.trim(), port.trim())),
                }
            }
            Launcher::Drove | Launcher::IndexedJob | Launcher::Pmi => None,
        }
    }

    fn progress(&self) -> Result<ProgressMode, EnvError> {
        match self.text(var::PROGRESS) {
            None => Ok(ProgressMode::Rank),
            Some(v) => v.trim().parse().map_err(|()| EnvError::Malformed {
                var: var::PROGRESS,
                value: v,
                expected: "`launcher` (or unset)",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv, EnvError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        LaunchEnv::from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_is_a_world_of_one_in_its_first_attempt() {
        let e = env(&[]).unwrap();
        assert_eq!(e.rendezvous, RendezvousKind::Alone);
        assert!(!e.under_launcher() && !e.restarted());
        assert_eq!((e.place, e.local_rank, e.restart_count), (None, 0, 0));
        assert_eq!(e.progress, ProgressMode::Rank);
    }

    #[test]
    fn drove_run_s_variables_are_read_into_their_fields() {
        let e = env(&[
            (var::COORDINATOR, "127.0.0.1:7000"),
            (var::RUN_ID, "r1"),
            (var::RANK, "1"),
            (var::WORLD_SIZE, "2"),
            (var::LOCAL_RANK, "1"),
            (var::LOCAL_WORLD_SIZE, "2"),
            (var::TOKEN, "secret"),
            (var::RESTART_COUNT, "3"),
            (var::PROGRESS, "launcher"),
            (var::TIMELINE, "/tmp/t.json"),
        ])
        .unwrap();
        assert_eq!(e.rendezvous, RendezvousKind::Coordinator);
        assert_eq!(e.place, Some(RankRequest::Given(drove_collective::Place::new(1, 2).unwrap())));
        assert_eq!((e.rank(), e.world_size().map(WorldSize::get)), (Some(Rank::new(1)), Some(2)));
        assert_eq!((e.local_rank, e.local_world_size), (1, Some(2)));
        assert_eq!(e.coordinator.as_deref(), Some("127.0.0.1:7000"));
        assert_eq!((e.run_id.as_deref(), e.token.as_deref()), (Some("r1"), Some("secret")));
        assert!(e.restarted() && e.restart_count == 3);
        assert_eq!(e.progress, ProgressMode::Launcher);
        assert_eq!(e.timeline, Some(PathBuf::from("/tmp/t.json")));
    }

    #[test]
    fn an_indexed_job_s_index_is_the_rank() {
        let e = env(&[(var::COORDINATOR, "c:1"), (var::WORLD_SIZE, "4"), (var::JOB_COMPLETION_INDEX, "3")])
            .unwrap();
        assert_eq!((e.rank(), e.world_size().map(WorldSize::get)), (Some(Rank::new(3)), Some(4)));
        let any = env(&[(var::COORDINATOR, "c:1"), (var::WORLD_SIZE, "4")]).unwrap();
        assert_eq!(any.place, Some(RankRequest::Any(WorldSize::new(4).unwrap())));
    }

    #[test]
    fn each_malformed_value_is_named_with_what_it_holds() {
        let bad = |vars: &[(&str, &str)], name: &str| {
            let e = env(vars).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        };
        bad(&[(var::RESTART_COUNT, "two")], "DROVE_RESTART_COUNT=\"two\"");
        bad(&[(var::HEARTBEAT_SECS, "often")], "DROVE_HEARTBEAT_SECS=\"often\"");
        bad(&[(var::BIND, "here")], "DROVE_BIND=\"here\"");
        bad(&[(var::LOCAL_RANK, "-1")], "DROVE_LOCAL_RANK=\"-1\"");
        bad(&[(var::PROGRESS, "bar")], "DROVE_PROGRESS=\"bar\"");
        bad(&[(var::COORDINATOR, "c:1")], "DROVE_WORLD_SIZE");
        bad(&[(var::COORDINATOR, "c:1"), (var::WORLD_SIZE, "2"), (var::RANK, "2")], "DROVE_RANK=2");
        bad(
            &[
                (var::COORDINATOR, "c:1"),
                (var::WORLD_SIZE, "2"),
                (var::RANK, "0"),
                (var::JOB_COMPLETION_INDEX, "1"),
            ],
            "disagree",
        );
    }

    #[test]
    fn the_communicator_s_settings_are_read_and_checked() {
        let e = env(&[
            (var::COMM_TIMEOUT, "6"),
            (var::COMM_HANG_LIMIT, "90"),
            (var::COMM_TRANSPORT, "tcp"),
            (var::HOST_ID, "node-a"),
        ])
        .unwrap();
        let o = e.comm_options();
        assert_eq!((o.timeout, o.warn_after, o.hang_limit), (secs(6.0), secs(2.0), secs(90.0)));
        assert_eq!((o.transport, o.host_id.as_deref()), (Transport::Tcp, Some("node-a")));
        let o = env(&[(var::COMM_WARN_AFTER, "1.5")]).unwrap().comm_options();
        assert_eq!((o.timeout, o.warn_after), (CommOptions::default().timeout, secs(1.5)));
        let bad = |vars: &[(&str, &str)], name: &str| {
            let e = env(vars).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        };
        bad(&[(var::COMM_TIMEOUT, "0")], "DROVE_COMM_TIMEOUT=\"0\" is not a positive number of seconds");
        bad(&[(var::COMM_HANG_LIMIT, "long")], "DROVE_COMM_HANG_LIMIT=\"long\"");
        bad(&[(var::COMM_TRANSPORT, "udp")], "DROVE_COMM_TRANSPORT=\"udp\"");
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn an_elastic_member_needs_no_world_size_and_its_settings_are_checked() {
        let e = env(&[(var::COORDINATOR, "c:1"), (var::ELASTIC, "3:4"), (var::MEMBER_ID, "pod-2")]).unwrap();
        assert_eq!(e.elastic, Some(WorldRange::new(3, 4).unwrap()));
        assert_eq!((e.place, e.member_id.as_deref()), (None, Some("pod-2")));
        let bad = |vars: &[(&str, &str)], name: &str| {
            let e = env(vars).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        };
        bad(&[(var::COORDINATOR, "c:1"), (var::ELASTIC, "4:3")], "DROVE_ELASTIC=\"4:3\"");
        bad(&[(var::COORDINATOR, "c:1"), (var::ELASTIC, "0:3")], "DROVE_ELASTIC=\"0:3\"");
        bad(&[(var::ELASTIC, "2"), (var::SETTLE_SECS, "-1")], "DROVE_SETTLE_SECS=\"-1\"");
        let given = WorldRange::new(2, 5).unwrap();
        let flag =
            LaunchEnv::from_lookup_elastic(|n| (n == var::COORDINATOR).then(|| "c:1".into()), Some(given));
        assert_eq!(flag.unwrap().elastic, Some(given), "a command's --world needs no DROVE_WORLD_SIZE");
    }

    #[test]
    fn the_rendezvous_is_the_first_one_set() {
        assert_eq!(
            env(&[(var::RENDEZVOUS_DIR, "/d"), (var::WORLD_SIZE, "1")]).unwrap().rendezvous,
            RendezvousKind::Directory
        );
        assert_eq!(
            env(&[(var::PEERS, "a:1"), (var::WORLD_SIZE, "1")]).unwrap().rendezvous,
            RendezvousKind::Peers
        );
        assert_eq!(
            env(&[(var::COORDINATOR, "c:1"), (var::PEERS, "a:1"), (var::WORLD_SIZE, "1")])
                .unwrap()
                .rendezvous,
            RendezvousKind::Coordinator
        );
    }

    #[test]
    fn another_launcher_places_the_process_and_drove_s_variables_win() {
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ];
        let mut vars = ompi.to_vec();
        vars.push((var::COORDINATOR, "c:1"));
        let e = env(&vars).unwrap();
        assert_eq!(
            (e.launcher, e.rank(), e.world_size().map(WorldSize::get)),
            (Some(Launcher::OpenMpi), Some(Rank::new(2)), Some(3))
        );
        assert_eq!(e.local_rank, 1, "the launcher's local rank picks the GPU");
        assert!(e.placed_by_foreign_launcher());
        vars.extend([(var::RANK, "0"), (var::WORLD_SIZE, "2"), (var::LOCAL_RANK, "0")]);
        let e = env(&vars).unwrap();
        assert_eq!(
            (e.launcher, e.rank(), e.local_rank),
            (Some(Launcher::Drove), Some(Rank::new(0)), 0),
            "drove's win"
        );
        let indexed =
            env(&[(var::COORDINATOR, "c:1"), (var::WORLD_SIZE, "4"), (var::JOB_COMPLETION_INDEX, "3")])
                .unwrap();
        assert_eq!(indexed.launcher, Some(Launcher::IndexedJob));
        assert!(!indexed.placed_by_foreign_launcher());
    }

    #[test]
    fn torchrun_s_master_is_the_coordinator_rank_0_serves_and_its_job_the_run() {
        let vars = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            (var::MASTER_ADDR, "10.0.0.5"),
            (var::MASTER_PORT, "29500"),
        ];
        let e = env(&vars).unwrap();
        assert_eq!(
            (e.coordinator.as_deref(), e.coordinator_source),
            (Some("10.0.0.5:29500"), Some(CoordinatorSource::Master))
        );
        assert_eq!(e.rendezvous, RendezvousKind::Coordinator);
        assert_eq!(e.run_id.as_deref(), Some("torchrun-10.0.0.5-29500"));
        let mut job = vars.to_vec();
        job[3] = (var::MASTER_ADDR, "bert-ner-master-0");
        assert_eq!(env(&job).unwrap().run_id.as_deref(), Some("bert-ner"), "a PyTorchJob's name");
        job.push((var::TORCHELASTIC_RUN_ID, "exp7"));
        assert_eq!(env(&job).unwrap().run_id.as_deref(), Some("torchrun-exp7"));
        job.push((var::RUN_ID, "mine"));
        job.push((var::COORDINATOR, "c:1"));
        let given = env(&job).unwrap();
        assert_eq!(
            (given.run_id.as_deref(), given.coordinator.as_deref()),
            (Some("mine"), Some("c:1")),
            "drove's win"
        );
        assert_eq!(given.coordinator_source, Some(CoordinatorSource::Given));
    }

    /// torchrun's variables as `drove run` gives them beside drove's, and as
    /// another launcher or a stale shell may leave them: contradicting
    /// drove's, out of range, malformed, incomplete, or disagreeing with
    /// `mpirun`'s.
    const TORCHRUN_BESIDE: [&[(&str, &str)]; 5] = [
        &[
            (var::TORCH_RANK, "1"),
            (var::TORCH_WORLD_SIZE, "2"),
            (var::TORCH_LOCAL_RANK, "1"),
            (var::TORCH_LOCAL_WORLD_SIZE, "2"),
            (var::GROUP_RANK, "0"),
            (var::MASTER_ADDR, "127.0.0.1"),
            (var::MASTER_PORT, "29533"),
            (var::TORCHELASTIC_RESTART_COUNT, "0"),
        ],
        &[
            (var::TORCH_RANK, "5"),
            (var::TORCH_WORLD_SIZE, "8"),
            (var::TORCH_LOCAL_RANK, "3"),
            (var::MASTER_ADDR, "bert-ner-master-0"),
            (var::MASTER_PORT, "29500"),
            (var::TORCHELASTIC_RUN_ID, "exp7"),
        ],
        &[
            (var::TORCH_RANK, "x"),
            (var::TORCH_WORLD_SIZE, "0"),
            (var::MASTER_ADDR, "h"),
            (var::MASTER_PORT, "0"),
        ],
        &[(var::TORCH_RANK, "2"), (var::TORCH_WORLD_SIZE, "2"), (var::MASTER_ADDR, "h")],
        &[
            (var::TORCH_RANK, "0"),
            (var::TORCH_WORLD_SIZE, "3"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            (var::MASTER_PORT, "29500"),
        ],
    ];

    #[test]
    fn drove_s_variables_with_torchrun_s_beside_them_resolve_as_drove_s_alone() {
        let drove: [&[(&str, &str)]; 7] = [
            // drove run's rank 0 and rank 1 of a fixed world, a restart of it
            &[
                (var::COORDINATOR, "127.0.0.1:7000"),
                (var::RUN_ID, "r1"),
                (var::RANK, "0"),
                (var::WORLD_SIZE, "2"),
                (var::LOCAL_RANK, "0"),
                (var::LOCAL_WORLD_SIZE, "2"),
                (var::RESTART_COUNT, "0"),
                (var::PROGRESS, "launcher"),
            ],
            &[
                (var::COORDINATOR, "127.0.0.1:7000"),
                (var::RUN_ID, "r1"),
                (var::RANK, "1"),
                (var::WORLD_SIZE, "2"),
                (var::LOCAL_RANK, "1"),
                (var::RESTART_COUNT, "3"),
            ],
            // drove run --min-np's member
            &[
                (var::COORDINATOR, "127.0.0.1:7000"),
                (var::RANK, "1"),
                (var::WORLD_SIZE, "2"),
                (var::ELASTIC, "1:3"),
                (var::MEMBER_ID, "h.1.slot-1"),
            ],
            // an Indexed Job, any free rank, peers, a shared folder
            &[(var::COORDINATOR, "c:1"), (var::WORLD_SIZE, "4"), (var::JOB_COMPLETION_INDEX, "3")],
            &[(var::COORDINATOR, "c:1"), (var::WORLD_SIZE, "4")],
            &[(var::PEERS, "a:1,b:2"), (var::WORLD_SIZE, "2"), (var::RANK, "0")],
            &[(var::RENDEZVOUS_DIR, "/d"), (var::WORLD_SIZE, "2"), (var::RANK, "1")],
        ];
        for d in drove {
            let alone = env(d).unwrap();
            assert!(matches!(alone.launcher, Some(Launcher::Drove | Launcher::IndexedJob)), "{d:?}");
            for t in TORCHRUN_BESIDE {
                let both: Vec<_> = d.iter().chain(t.iter()).copied().collect();
                let e = env(&both).unwrap_or_else(|e| panic!("{both:?}: {e}"));
                assert_eq!(e, alone, "{both:?}");
                assert_ne!(e.coordinator_source, Some(CoordinatorSource::Master), "{both:?}");
                // Rank 0 serves no coordinator, so binds no port: MASTER_PORT is PyTorch's.
                assert!(e.serve_coordinator().unwrap().is_none(), "{both:?}");
            }
        }
    }

    #[test]
    fn drove_s_rendezvous_wins_over_the_meeting_place_of_the_launcher_that_placed_the_process() {
        let torchrun = [
            (var::TORCH_RANK, "1"),
            (var::TORCH_WORLD_SIZE, "2"),
            (var::MASTER_ADDR, "10.0.0.5"),
            (var::MASTER_PORT, "29500"),
        ];
        for (drove, kind) in [
            ((var::PEERS, "a:1,b:2"), RendezvousKind::Peers),
            ((var::PEERS_FILE, "/peers"), RendezvousKind::Peers),
            ((var::RENDEZVOUS_DIR, "/d"), RendezvousKind::Directory),
        ] {
            let mut vars = torchrun.to_vec();
            vars.push(drove);
            let e = env(&vars).unwrap();
            assert_eq!((e.rendezvous, e.coordinator.as_deref(), e.coordinator_source), (kind, None, None));
            assert_eq!(
                (e.launcher, e.rank()),
                (Some(Launcher::Torchrun), Some(Rank::new(1))),
                "the place is torchrun's"
            );
            vars[3] = (var::MASTER_PORT, "not a port");
            assert_eq!(env(&vars).unwrap().rendezvous, kind, "MASTER_PORT is not read");
        }
        // DROVE_RANK beside torchrun's place without DROVE_WORLD_SIZE: not silently outvoted.
        let mut vars = torchrun.to_vec();
        vars.push((var::RANK, "0"));
        assert_eq!(
            env(&vars).unwrap_err().to_string(),
            "DROVE_RANK=0 is set without DROVE_WORLD_SIZE, beside torchrun placing this process as rank 1 of 2: \
             set DROVE_WORLD_SIZE too (then drove's variables win), or unset DROVE_RANK"
        );
        vars.push((var::WORLD_SIZE, "3"));
        assert_eq!(env(&vars).unwrap().rank(), Some(Rank::new(0)));
    }

    #[test]
    fn a_slurm_task_meets_at_its_job_s_first_host() {
        let mut vars = vec![
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            (var::SLURM_STEP_ID, "0"),
            (var::SLURM_JOB_ID, "1234"),
            (var::SLURM_JOB_NODELIST, "node[07-08]"),
        ];
        let e = env(&vars).unwrap();
        assert_eq!((e.launcher, e.local_rank), (Some(Launcher::Slurm), 1));
        assert_eq!(e.coordinator.as_deref(), Some("node07:29634"), "29400 + 1234 % 1000");
        assert_eq!(e.coordinator_source, Some(CoordinatorSource::SlurmFirstHost));
        assert_eq!(e.run_id.as_deref(), Some("slurm-1234.0"));
        vars.push((var::COORDINATOR_PORT, "40000"));
        assert_eq!(env(&vars).unwrap().coordinator.as_deref(), Some("node07:40000"));
    }

    #[test]
    fn a_launcher_s_place_without_a_meeting_point_or_with_a_bad_one_is_named() {
        let bad = |vars: &[(&str, &str)], want: &str| {
            let e = env(vars).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(
            &[("PMI_RANK", "1"), ("PMI_SIZE", "2")],
            "pmi placed this process as rank 1 of 2, but nothing says where the ranks meet",
        );
        bad(
            &[("RANK", "0"), ("WORLD_SIZE", "2"), (var::MASTER_ADDR, "h")],
            "MASTER_ADDR and MASTER_PORT go together",
        );
        bad(
            &[("RANK", "0"), ("WORLD_SIZE", "2"), (var::MASTER_ADDR, "h"), (var::MASTER_PORT, "0")],
            "MASTER_PORT=\"0\" is not a port number",
        );
        bad(
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                (var::SLURM_STEP_ID, "0"),
                (var::SLURM_JOB_NODELIST, "n[1-"),
            ],
            "SLURM_JOB_NODELIST: the Slurm host list \"n[1-\" cannot be read",
        );
        // One rank of one: nothing to meet.
        let one = env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")]).unwrap();
        assert_eq!((one.rendezvous, one.launcher), (RendezvousKind::Alone, Some(Launcher::OpenMpi)));
    }
}

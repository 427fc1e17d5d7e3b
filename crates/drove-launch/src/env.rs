//! The launch environment: every variable a launcher (`drove run`, a
//! Kubernetes Indexed Job, a script) hands a rank, read once into a type.
//!
//! The names are constants in [`var`], so the launcher that writes them and the
//! rank that reads them cannot drift apart. A malformed value is an error
//! naming the variable and what it holds; a missing one is `None` where the
//! contract allows it (a process started by hand is a world of one).

use std::path::PathBuf;
use std::time::Duration;

use drove_comm::{Rank, RankRequest, WorldRange, WorldSize};

use crate::error::EnvError;
use crate::progress::ProgressMode;

/// The variables' names.
pub mod var {
    /// This rank's place in the world, `0..DROVE_WORLD_SIZE`.
    pub const RANK: &str = "DROVE_RANK";
    /// The number of ranks in the world.
    pub const WORLD_SIZE: &str = "DROVE_WORLD_SIZE";
    /// This rank's place among the ranks on its host (picks its GPU).
    pub const LOCAL_RANK: &str = "DROVE_LOCAL_RANK";
    /// The number of ranks on this host.
    pub const LOCAL_WORLD_SIZE: &str = "DROVE_LOCAL_WORLD_SIZE";
    /// A Kubernetes Indexed Job's pod index: the rank when `DROVE_RANK` is unset.
    pub const JOB_COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";
    /// The run the ranks join on the coordinator.
    pub const RUN_ID: &str = "DROVE_RUN_ID";
    /// The coordinator, `host:port` or a URL.
    pub const COORDINATOR: &str = "DROVE_COORDINATOR";
    /// The coordinator's bearer token.
    pub const TOKEN: &str = "DROVE_TOKEN";
    /// How many times the launcher has restarted the world (0 in the first attempt).
    pub const RESTART_COUNT: &str = "DROVE_RESTART_COUNT";
    /// `launcher`: the launcher draws the progress bar from rank 0's progress lines.
    pub const PROGRESS: &str = "DROVE_PROGRESS";
    /// A shared folder to rendezvous in, instead of a coordinator.
    pub const RENDEZVOUS_DIR: &str = "DROVE_RENDEZVOUS_DIR";
    /// Every rank's `host:port`, comma-separated, instead of a coordinator.
    pub const PEERS: &str = "DROVE_PEERS";
    /// A file of every rank's `host:port`, one a line, instead of a coordinator.
    pub const PEERS_FILE: &str = "DROVE_PEERS_FILE";
    /// Where to write the run's timeline (Chrome trace-event JSON).
    pub const TIMELINE: &str = "DROVE_TIMELINE";
    /// An elastic run's world sizes, `MIN:MAX` (set by `drove run --min-np`,
    /// or by hand; `drove train ner --world` overrides it).
    pub const ELASTIC: &str = "DROVE_ELASTIC";
    /// An elastic member's stable id (default: the Indexed Job's index, the
    /// launcher's slot, or host and process id).
    pub const MEMBER_ID: &str = "DROVE_MEMBER_ID";
    /// How long a forming elastic world waits for more members after its
    /// minimum, in seconds (default 2).
    pub const SETTLE_SECS: &str = "DROVE_SETTLE_SECS";
    /// How long an elastic member waits for its next world to form, in
    /// seconds (default 600); below MIN that long, the run fails.
    pub const RENDEZVOUS_TIMEOUT_SECS: &str = "DROVE_RENDEZVOUS_TIMEOUT_SECS";
}

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
    /// The world (`DROVE_WORLD_SIZE`) and the rank in it (`DROVE_RANK`, or
    /// `JOB_COMPLETION_INDEX`; else any free one), checked together; `None`
    /// when alone without a world size.
    pub place: Option<RankRequest>,
    /// `DROVE_LOCAL_RANK` (0 if unset).
    pub local_rank: usize,
    /// `DROVE_LOCAL_WORLD_SIZE`, if set.
    pub local_world_size: Option<usize>,
    /// `DROVE_RUN_ID`, if set.
    pub run_id: Option<String>,
    /// `DROVE_COORDINATOR`, if set.
    pub coordinator: Option<String>,
    /// `DROVE_TOKEN`, if set and not empty.
    pub token: Option<String>,
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
        let rendezvous = read.rendezvous();
        let elastic = match world {
            Some(range) => Some(range),
            None => read.elastic()?,
        };
        let place = match (rendezvous, read.text(var::WORLD_SIZE)) {
            (RendezvousKind::Alone, None) => None,
            // An elastic member's rank and world come from each generation.
            (_, None) if elastic.is_some() => None,
            _ => Some(drove_comm::launch_vars(&lookup).map_err(|e| EnvError::Place(e.to_string()))?),
        };
        Ok(LaunchEnv {
            place,
            local_rank: read.number(var::LOCAL_RANK)?.unwrap_or(0),
            local_world_size: read.number(var::LOCAL_WORLD_SIZE)?,
            run_id: read.text(var::RUN_ID),
            coordinator: read.text(var::COORDINATOR),
            token: read.text(var::TOKEN),
            restart_count: read.number(var::RESTART_COUNT)?.unwrap_or(0),
            progress: read.progress()?,
            timeline: read.text(var::TIMELINE).map(PathBuf::from),
            rendezvous,
            elastic,
            member_id: read.text(var::MEMBER_ID),
            job_index: read.number(var::JOB_COMPLETION_INDEX)?,
            settle: read.seconds(var::SETTLE_SECS)?,
            rendezvous_timeout: read.seconds(var::RENDEZVOUS_TIMEOUT_SECS)?,
        })
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
}

/// Reads and parses single variables, naming the variable in every error.
struct Reader<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Reader<'_, F> {
    /// A variable's value, `None` if unset or blank.
    fn text(&self, name: &'static str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
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

    fn rendezvous(&self) -> RendezvousKind {
        if self.text(var::COORDINATOR).is_some() {
            RendezvousKind::Coordinator
        } else if self.text(var::RENDEZVOUS_DIR).is_some() {
            RendezvousKind::Directory
        } else if self.text(var::PEERS).is_some() || self.text(var::PEERS_FILE).is_some() {
            RendezvousKind::Peers
        } else {
            RendezvousKind::Alone
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
        assert_eq!(e.place, Some(RankRequest::Given(drove_comm::Place::new(1, 2).unwrap())));
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
}

//! The rank side of the contract: what a training program builds from its
//! [`LaunchEnv`] to behave like `drove train ner` under any launcher.
//!
//! - [`LaunchEnv::communicator`]: the other ranks, or a world of one
//!   ([`connect_from_env`]: drove-comm's `Communicator` itself).
//! - [`LaunchEnv::metrics`]: a recorder to the coordinator, if there is one.
//! - [`LaunchEnv::start`]: start fresh, or resume after a restart.
//! - [`LaunchEnv::serve_coordinator`]: on rank 0, the coordinator the
//!   launcher named a place for (`MASTER_ADDR`, a Slurm job's first host).
//! - [`LaunchEnv::finish`]: at the end, leave the run (under a launcher
//!   that does not) and keep rank 0's coordinator up until all have left.
//! - [`Launched`]: all of these at once (a fixed world or an elastic run's
//!   [`Ranks`]), with progress lines for the launcher, ended as a
//!   [`RankOutcome`] says.

use std::path::Path;
use std::time::Duration;

use drove_collective::{Collective, CommError, Elastic, MemberId, Place, SingleProcess, WorldRange};
use drove_comm::{Communicator, FileRendezvous, RankRequest, StaticRendezvous, parse_peers};
use drove_control::{
    CoordinatorRendezvous, DEFAULT_RENDEZVOUS_TIMEOUT, DEFAULT_SETTLE, ElasticComm, Membership,
};
use drove_metrics::{Delivery, MetricsRecorder, Reading, RecorderOptions, RecorderTarget};

use crate::error::LaunchError;
use crate::progress::{Progress, ProgressMode};
use crate::rank::env::{LaunchEnv, RendezvousKind};
use crate::rank::served::{LINGER, ServedCoordinator};
use crate::var;

/// The run id metrics go under when the launcher set none.
pub const DEFAULT_RUN_ID: &str = "train";

/// How a rank begins its training.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// From the initial weights.
    Fresh,
    /// From the latest checkpoint: the launcher restarted the world and one exists.
    Resume,
}

impl LaunchEnv {
    /// The ranks the launcher started this process among (through its
    /// rendezvous, with [`comm_options`](Self::comm_options)), or a world of
    /// one. With a coordinator rank 0 serves, the others wait for it to come
    /// up.
    pub fn communicator(&self) -> Result<Box<dyn Collective>, LaunchError> {
        Ok(match self.rendezvous {
            RendezvousKind::Alone => Box::new(SingleProcess),
            _ => Box::new(self.connect()?),
        })
    }

    /// drove-comm's [`Communicator`] through the launcher's rendezvous: the
    /// coordinator, `DROVE_RENDEZVOUS_DIR`, else `DROVE_PEERS` or
    /// `DROVE_PEERS_FILE` (an error naming what is missing when none is
    /// set); the settings are [`comm_options`](Self::comm_options), the
    /// wait for the world through a coordinator at most
    /// `DROVE_RENDEZVOUS_TIMEOUT_SECS` where that is set.
    pub fn connect(&self) -> Result<Communicator, LaunchError> {
        let mut opts = self.comm_options();
        if let (RendezvousKind::Coordinator, Some(request)) = (self.rendezvous, self.place) {
            if let Some(wait) = self.rendezvous_timeout {
                opts.connect_timeout = wait;
            }
            return Ok(Communicator::connect(&self.coordinator_rendezvous(request)?, opts)?);
        }
        let place = self.given_place()?;
        if let Some(dir) = &self.rendezvous_dir {
            return Ok(Communicator::connect(&FileRendezvous::new(dir, place), opts)?);
        }
        let (source, peers) = if let Some(file) = &self.peers_file {
            let text = std::fs::read_to_string(file)
                .map_err(|e| CommError::io(format!("reading {}", file.display()), e))?;
            (file.display().to_string(), parse_peers(&text, '\n', var::PEERS_FILE)?)
        } else {
            let list = self.peers.as_deref().ok_or_else(|| {
                CommError::Rendezvous(format!("neither {} nor {} is set", var::PEERS, var::PEERS_FILE))
            })?;
            (var::PEERS.to_string(), parse_peers(list, ',', var::PEERS)?)
        };
        if peers.len() != place.world().get() {
            return Err(CommError::Rendezvous(format!(
                "{source} lists {} addresses but {} is {}",
                peers.len(),
                var::WORLD_SIZE,
                place.world()
            ))
            .into());
        }
        Ok(Communicator::connect(&StaticRendezvous::new(place.rank(), peers)?, opts)?)
    }

    /// The rank and world the launcher gave, or the variable missing, named.
    fn given_place(&self) -> Result<Place, CommError> {
        match self.place {
            Some(RankRequest::Given(place)) => Ok(place),
            Some(RankRequest::Any(_)) => Err(CommError::Rendezvous(format!("{} is not set", var::RANK))),
            None => {
                let missing = if self.rank().is_none() { var::RANK } else { var::WORLD_SIZE };
                Err(CommError::Rendezvous(format!("{missing} is not set")))
            }
        }
    }

    /// The rendezvous through the coordinator, for `request`.
    fn coordinator_rendezvous(&self, request: RankRequest) -> Result<CoordinatorRendezvous, LaunchError> {
        let addr = self.coordinator.as_deref().ok_or_else(|| {
            LaunchError::Spec(format!("no coordinator to meet at: set {}", var::COORDINATOR))
        })?;
        let run_id = self.run_id.as_deref().unwrap_or(DEFAULT_RUN_ID);
        let served = self.coordinator_source.is_some_and(|s| s.served_by_rank_0());
        Ok(self.rendezvous_at(addr, run_id, request)?.waiting_for_coordinator(served))
    }

    /// The rendezvous at the coordinator `addr` for `run_id` and `request`,
    /// with this environment's token, heartbeat, restart count and bind
    /// address.
    pub fn rendezvous_at(
        &self,
        addr: &str,
        run_id: &str,
        request: RankRequest,
    ) -> Result<CoordinatorRendezvous, LaunchError> {
        let rendezvous = CoordinatorRendezvous::new(addr, run_id, request, self.token.as_deref())?
            .with_tls_ca(self.tls_ca.clone())
            .heartbeat(self.heartbeat)
            .restart_count(self.restart_count);
        Ok(match self.bind {
            Some(bind) => rendezvous.bind(bind),
            None => rendezvous,
        })
    }

    /// On rank 0, when the launcher named a place for the coordinator but
    /// none runs there (`MASTER_ADDR`, a Slurm job's first host): serves it,
    /// until [`finish`](Self::finish). `None` everywhere else.
    pub fn serve_coordinator(&self) -> Result<Option<ServedCoordinator>, LaunchError> {
        let Some(source) = self.coordinator_source.filter(|s| s.served_by_rank_0()) else { return Ok(None) };
        if self.rank().map(drove_collective::Rank::get) != Some(0) {
            return Ok(None);
        }
        let addr = self.coordinator.as_deref().unwrap_or_default();
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| LaunchError::Spec(format!("the coordinator address {addr:?} has no port")))?;
        if source == crate::rank::served::CoordinatorSource::SlurmFirstHost
            && let Some(node) = self.slurm_node.as_deref().filter(|n| *n != host)
        {
            return Err(LaunchError::Spec(format!(
                "rank 0 runs on node {node}, but the job's first node is {host}, where the others look for its \
                 coordinator: keep Slurm's default block distribution, or set {} (or {})",
                var::COORDINATOR,
                var::COORDINATOR_PORT
            )));
        }
        ServedCoordinator::start(port, addr, self.token.as_deref()).map(Some)
    }

    /// At the end of rank `rank`'s work (`error` if it failed): under a
    /// launcher other than drove's, the rank leaves the run on the
    /// coordinator (no launcher does it for it); then rank 0's `served`
    /// coordinator waits (at most [`LINGER`]) until every rank has left.
    pub fn finish(&self, rank: usize, error: Option<&str>, served: Option<ServedCoordinator>) {
        if self.placed_by_foreign_launcher()
            && let Some(request) = self.place.filter(|_| self.rendezvous == RendezvousKind::Coordinator)
        {
            let left = self
                .coordinator_rendezvous(request)
                .map_err(|e| e.to_string())
                .and_then(|rv| rv.leave(drove_collective::Rank::new(rank), error).map_err(|e| e.to_string()));
            if let Err(e) = left {
                tracing::warn!("rank {rank} could not leave the run: {e}");
            }
        }
        if let Some(served) = served {
            served.finish(self.run_id.as_deref().unwrap_or(DEFAULT_RUN_ID), LINGER);
        }
    }

    /// This process as a member of an elastic run of `range` world sizes
    /// (`DROVE_ELASTIC`, unless given), joined through the coordinator
    /// (`DROVE_COORDINATOR`, required), as member `DROVE_MEMBER_ID` (else the
    /// Indexed Job's index, else the launcher's slot `DROVE_RANK`, else the
    /// host and process id), its worlds settling for `DROVE_SETTLE_SECS` and
    /// each waited for at most `DROVE_RENDEZVOUS_TIMEOUT_SECS`.
    pub fn elastic(&self, range: Option<WorldRange>) -> Result<ElasticComm, LaunchError> {
        let range = range.or(self.elastic).ok_or_else(|| {
            LaunchError::Spec(format!(
                "an elastic run needs its world sizes: --world MIN:MAX or {}",
                var::ELASTIC
            ))
        })?;
        let Some(addr) = &self.coordinator else {
            return Err(LaunchError::Spec(format!(
                "an elastic run forms its worlds through a coordinator: set {} (drove run sets it)",
                var::COORDINATOR
            )));
        };
        let run_id = self.run_id.as_deref().unwrap_or(DEFAULT_RUN_ID);
        let request = RankRequest::Any(range.max());
        let rendezvous = self.rendezvous_at(addr, run_id, request)?;
        let membership = Membership {
            member: MemberId::new(self.member())?,
            range,
            settle: self.settle.unwrap_or(DEFAULT_SETTLE),
            rendezvous_timeout: self.rendezvous_timeout.unwrap_or(DEFAULT_RENDEZVOUS_TIMEOUT),
        };
        Ok(ElasticComm::join(rendezvous, membership, self.comm_options())?)
    }

    /// This process's member id in an elastic run.
    pub fn member(&self) -> String {
        if let Some(id) = &self.member_id {
            return id.clone();
        }
        match (self.job_index, self.rank()) {
            (Some(index), _) => format!("index-{index}"),
            (None, Some(rank)) => format!("slot-{rank}"),
            (None, None) => {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            }
        }
    }

    /// A metrics recorder for `rank` to the coordinator (`DROVE_METRICS_*`
    /// settings from the environment), or `None` without a coordinator.
    pub fn metrics(&self, rank: usize) -> Result<Option<MetricsRecorder>, LaunchError> {
        let Some(addr) = &self.coordinator else { return Ok(None) };
        let run_id = self.run_id.as_deref().unwrap_or(DEFAULT_RUN_ID);
        let defaults = RecorderOptions::default();
        let options = RecorderOptions {
            capacity: self.metrics_capacity.unwrap_or(defaults.capacity),
            flush_timeout: self.metrics_flush.unwrap_or(defaults.flush_timeout),
            tls_ca: self.tls_ca.clone(),
            ..defaults
        };
        Ok(Some(MetricsRecorder::new(
            RecorderTarget { address: addr, token: self.token.as_deref(), run_id, rank },
            options,
        )?))
    }

    /// [`Start::Resume`] when the launcher restarted the world and
    /// `latest_checkpoint` exists; else [`Start::Fresh`].
    pub fn start(&self, latest_checkpoint: &Path) -> Start {
        if self.restarted() && latest_checkpoint.exists() { Start::Resume } else { Start::Fresh }
    }
}

/// Reads the launch environment and connects drove-comm's [`Communicator`]
/// through the launcher's rendezvous ([`LaunchEnv::connect`]).
pub fn connect_from_env() -> Result<Communicator, LaunchError> {
    LaunchEnv::from_env()?.connect()
}

/// The ranks a launched process works among.
pub enum Ranks {
    /// The world the launcher started (or a world of one).
    Fixed(Box<dyn Collective>),
    /// A member of an elastic run (`DROVE_ELASTIC`, a command's `--world`):
    /// its worlds re-form as members come and go.
    Elastic(Box<ElasticComm>),
}

impl Ranks {
    /// The collective of the current world.
    pub fn collective(&self) -> &dyn Collective {
        match self {
            Ranks::Fixed(comm) => comm.as_ref(),
            Ranks::Elastic(comm) => comm.as_ref(),
        }
    }
}

/// How a rank's work ended, for [`Launched::finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankOutcome<'a> {
    /// It finished after `steps` steps.
    Finished {
        /// The steps it completed.
        steps: u64,
    },
    /// It failed after `steps` steps.
    Failed {
        /// The steps it completed.
        steps: u64,
        /// What failed.
        error: &'a str,
    },
    /// The elastic run left it out (its error is its own: it is no longer a
    /// member, so it does not leave).
    LeftOut {
        /// What it was told.
        error: &'a str,
    },
}

impl RankOutcome<'_> {
    fn error(&self) -> Option<&str> {
        match *self {
            RankOutcome::Finished { .. } => None,
            RankOutcome::Failed { error, .. } | RankOutcome::LeftOut { error } => Some(error),
        }
    }
}

/// A rank that has joined its world: the one rank lifecycle of every drove
/// program under a launcher (`drove train ner`, `drove check`, the GPU
/// trainer, a user's own loop).
///
/// [`join`](Self::join) serves the coordinator on rank 0 where the launcher
/// names a place for it, joins the other ranks (a fixed world, or an
/// elastic run's member when the environment says so) and starts a metrics
/// recorder when there is a coordinator; [`finish`](Self::finish) leaves the
/// elastic run, delivers the last metrics, leaves the run under a foreign
/// launcher, and keeps rank 0's coordinator up until every rank has left.
pub struct Launched {
    env: LaunchEnv,
    served: Option<ServedCoordinator>,
    ranks: Ranks,
    metrics: Option<MetricsRecorder>,
}

impl Launched {
    /// Reads the environment, joins the other ranks and starts the recorder.
    pub fn join() -> Result<Self, LaunchError> {
        Self::from_launch_env(LaunchEnv::from_env()?)
    }

    /// [`join`](Self::join) with an environment already read: an elastic
    /// run's member when it names one ([`LaunchEnv::elastic`]), else the
    /// launcher's world ([`LaunchEnv::communicator`]).
    pub fn from_launch_env(env: LaunchEnv) -> Result<Self, LaunchError> {
        let served = env.serve_coordinator()?;
        let ranks = match env.elastic {
            Some(range) => Ranks::Elastic(Box::new(env.elastic(Some(range))?)),
            None => Ranks::Fixed(env.communicator()?),
        };
        let metrics = env.metrics(ranks.collective().rank())?;
        Ok(Launched { env, served, ranks, metrics })
    }

    /// The launch environment.
    pub fn env(&self) -> &LaunchEnv {
        &self.env
    }

    /// The ranks: a fixed world or an elastic run's.
    pub fn ranks(&self) -> &Ranks {
        &self.ranks
    }

    /// The communicator (to hand to `drove_train::Replica`).
    pub fn comm(&self) -> &dyn Collective {
        self.ranks.collective()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm().rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.comm().world_size()
    }

    /// See [`LaunchEnv::start`].
    pub fn start(&self, latest_checkpoint: &Path) -> Start {
        self.env.start(latest_checkpoint)
    }

    /// The metrics recorder, for an observer that records through it itself
    /// (drove-ner's `MetricsObserver`); [`record`](Self::record) and
    /// [`event`](Self::event) record nothing after.
    pub fn take_metrics(&mut self) -> Option<MetricsRecorder> {
        self.metrics.take()
    }

    /// Records `name = value` at `step` (nothing without a coordinator; a
    /// value that is not finite is skipped).
    pub fn record(&self, step: u64, name: &str, value: f64) {
        if let Some(m) = &self.metrics
            && value.is_finite()
        {
            m.record(Reading { step: step as f64, name, value });
        }
    }

    /// Records an event of the run now, waiting at most 10 s.
    pub fn event(&self, step: u64, kind: &str, message: &str) -> Result<(), LaunchError> {
        match &self.metrics {
            Some(m) => Ok(m.event(step as f64, kind, message, Duration::from_secs(10))?),
            None => Ok(()),
        }
    }

    /// Reports progress: on rank 0 under a launcher that draws the bar, a
    /// progress line; returns whether it was sent (else show it yourself, or not).
    pub fn progress(&self, p: &Progress) -> bool {
        let send = self.rank() == 0 && self.env.progress == ProgressMode::Launcher;
        if send {
            p.send();
        }
        send
    }

    /// Delivers the metrics recorded so far, waiting at most `timeout` (before
    /// a rank ends abruptly, say).
    pub fn flush(&self, timeout: Duration) -> Result<(), LaunchError> {
        match &self.metrics {
            Some(m) => m.flush(timeout).map(drop).map_err(LaunchError::from),
            None => Ok(()),
        }
    }

    /// Ends the rank as `outcome` says: a member of an elastic run leaves it
    /// (unless it was left out); the last metrics are delivered (bounded by
    /// `DROVE_METRICS_FLUSH_SECS`) and what was not is returned (`None`
    /// without a recorder); then, as [`LaunchEnv::finish`] does, the rank
    /// leaves the run under a foreign launcher and rank 0's coordinator
    /// waits until every rank has.
    pub fn finish(mut self, outcome: RankOutcome<'_>) -> Option<Delivery> {
        let rank = self.rank();
        if let Ranks::Elastic(comm) = &self.ranks {
            let left = match outcome {
                RankOutcome::Finished { steps } => comm.leave(steps, None),
                RankOutcome::Failed { steps, error } => comm.leave(steps, Some(error)),
                RankOutcome::LeftOut { .. } => Ok(()),
            };
            if let Err(e) = left {
                tracing::warn!("rank {rank}: leaving the elastic run: {e}");
            }
        }
        drop(std::mem::replace(&mut self.ranks, Ranks::Fixed(Box::new(SingleProcess))));
        let delivery = self.metrics.take().map(MetricsRecorder::close);
        let error = outcome.error().map(|e| format!("rank {rank}: {e}"));
        self.env.finish(rank, error.as_deref(), self.served.take());
        delivery
    }
}

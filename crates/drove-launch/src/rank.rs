//! The rank side of the contract: what a training program builds from its
//! [`LaunchEnv`] to behave like `drove train ner` under any launcher.
//!
//! - [`LaunchEnv::communicator`]: the other ranks, or a world of one.
//! - [`LaunchEnv::metrics`]: a recorder to the coordinator, if there is one.
//! - [`LaunchEnv::start`]: start fresh, or resume after a restart.
//! - [`Launched`]: all three at once, with progress lines for the launcher.

use std::path::Path;
use std::time::Duration;

use drove_comm::{
    Collective, CommOptions, Communicator, CoordinatorRendezvous, DEFAULT_RENDEZVOUS_TIMEOUT, DEFAULT_SETTLE,
    ElasticComm, MemberId, Membership, RankRequest, SingleProcess, WorldRange,
};
use drove_metrics::{Delivery, MetricsRecorder, RecorderOptions};

use crate::env::{LaunchEnv, RendezvousKind, var};
use crate::error::LaunchError;
use crate::progress::{Progress, ProgressMode};

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
    /// rendezvous; the transport settings come from `DROVE_COMM_*`, see
    /// `drove_comm::CommOptions::from_env`), or a world of one.
    pub fn communicator(&self) -> Result<Box<dyn Collective>, LaunchError> {
        Ok(match self.rendezvous {
            RendezvousKind::Alone => Box::new(SingleProcess),
            _ => Box::new(Communicator::from_env()?),
        })
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
        let rendezvous = CoordinatorRendezvous::from_env_with(addr, run_id, request)?;
        let membership = Membership {
            member: MemberId::new(self.member())?,
            range,
            settle: self.settle.unwrap_or(DEFAULT_SETTLE),
            rendezvous_timeout: self.rendezvous_timeout.unwrap_or(DEFAULT_RENDEZVOUS_TIMEOUT),
        };
        Ok(ElasticComm::join(rendezvous, membership, CommOptions::from_env()?)?)
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
        let options = RecorderOptions::from_env()?;
        Ok(Some(MetricsRecorder::new(addr, self.token.as_deref(), run_id, rank, options)?))
    }

    /// [`Start::Resume`] when the launcher restarted the world and
    /// `latest_checkpoint` exists; else [`Start::Fresh`].
    pub fn start(&self, latest_checkpoint: &Path) -> Start {
        if self.restarted() && latest_checkpoint.exists() { Start::Resume } else { Start::Fresh }
    }
}

/// A rank that has joined its world: the communicator, the metrics recorder
/// and progress reporting, from the launch environment.
pub struct Launched {
    env: LaunchEnv,
    comm: Box<dyn Collective>,
    metrics: Option<MetricsRecorder>,
}

impl Launched {
    /// Reads the environment, joins the other ranks and starts the recorder.
    pub fn join() -> Result<Self, LaunchError> {
        Self::from_launch_env(LaunchEnv::from_env()?)
    }

    /// [`join`](Self::join) with an environment already read.
    pub fn from_launch_env(env: LaunchEnv) -> Result<Self, LaunchError> {
        let comm = env.communicator()?;
        let metrics = env.metrics(comm.rank())?;
        Ok(Launched { env, comm, metrics })
    }

    /// The launch environment.
    pub fn env(&self) -> &LaunchEnv {
        &self.env
    }

    /// The communicator (to hand to `drove_train::Replica`).
    pub fn comm(&self) -> &dyn Collective {
        self.comm.as_ref()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// See [`LaunchEnv::start`].
    pub fn start(&self, latest_checkpoint: &Path) -> Start {
        self.env.start(latest_checkpoint)
    }

    /// Records `name = value` at `step` (nothing without a coordinator; a
    /// value that is not finite is skipped).
    pub fn record(&self, step: u64, name: &str, value: f64) {
        if let Some(m) = &self.metrics
            && value.is_finite()
        {
            m.record(step as f64, name, value);
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

    /// Delivers the last metrics (bounded by `DROVE_METRICS_FLUSH_SECS`) and
    /// says what was not delivered; `None` without a coordinator.
    pub fn finish(mut self) -> Option<Delivery> {
        self.metrics.take().map(MetricsRecorder::close)
    }
}

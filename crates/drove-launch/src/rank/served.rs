//! The coordinator rank 0 serves when the launcher names a meeting place but
//! nothing runs there: torchrun's and PyTorchJob's `MASTER_ADDR` and
//! `MASTER_PORT`, or the first host of a Slurm step's node list, as torch's
//! `TCPStore` runs on rank 0. Every rank (rank 0 too) then rendezvouses
//! through it like through any coordinator; rank 0 keeps it up until every
//! rank has left the run, so no rank loses its last metrics or its leave.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::connection::connection;
use crate::error::LaunchError;

/// Where the ranks' coordinator comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinatorSource {
    /// `DROVE_COORDINATOR`: one that runs already.
    Given,
    /// `MASTER_ADDR` and `MASTER_PORT` (torchrun, PyTorchJob): rank 0 serves it.
    Master,
    /// The first host of `SLURM_JOB_NODELIST`, on `DROVE_COORDINATOR_PORT`
    /// or the job's default port: rank 0 serves it.
    SlurmFirstHost,
}

impl CoordinatorSource {
    /// Whether rank 0 serves the coordinator itself.
    pub fn served_by_rank_0(self) -> bool {
        !matches!(self, CoordinatorSource::Given)
    }

    /// Its name, as `drove check --json` reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            CoordinatorSource::Given => "given",
            CoordinatorSource::Master => "master-addr",
            CoordinatorSource::SlurmFirstHost => "slurm-first-host",
        }
    }
}

/// The default port of the coordinator rank 0 serves under Slurm: 29400 plus
/// the job id modulo 1000, so two jobs whose first node is the same meet on
/// different ports.
pub fn slurm_default_port(job_id: u64) -> u16 {
    29400 + (job_id % 1000) as u16
}

/// How long rank 0 keeps its coordinator up, at the end, for the other ranks
/// to leave.
pub const LINGER: Duration = Duration::from_secs(60);

/// A coordinator served in this process (rank 0's), on every interface at
/// its port, with a temporary store.
pub struct ServedCoordinator {
    runtime: tokio::runtime::Runtime,
    server: Option<crate::serve::Server>,
    dial: String,
    token: Option<String>,
    _store: tempfile::TempDir,
}

impl ServedCoordinator {
    /// Serves on `0.0.0.0:port`; `dial` is the address the ranks use.
    pub fn start(port: u16, dial: &str, token: Option<&str>) -> Result<Self, LaunchError> {
        let store = tempfile::Builder::new()
            .prefix("drove-rank0-store-")
            .tempdir()
            .map_err(|e| LaunchError::io("creating rank 0's coordinator store", e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| LaunchError::io("starting rank 0's coordinator runtime", e))?;
        let listen = SocketAddr::from(([0, 0, 0, 0], port));
        let server =
            runtime.block_on(crate::serve::in_process(listen, store.path(), token, None)).map_err(|e| {
                LaunchError::Coordinator(format!(
                    "rank 0 cannot serve the coordinator on port {port} (the other ranks dial {dial}): {e}"
                ))
            })?;
        tracing::info!(port, dial, "rank 0 serves the run's coordinator");
        Ok(ServedCoordinator {
            runtime,
            server: Some(server),
            dial: dial.to_string(),
            token: token.map(str::to_string),
            _store: store,
        })
    }

    /// Waits until run `run_id` has ended (every rank left, or it failed),
    /// at most `within`, then stops serving.
    pub fn finish(mut self, run_id: &str, within: Duration) {
        let until = Instant::now() + within;
        let connection = connection(&self.dial, self.token.as_deref());
        let ended =
            self.runtime.block_on(drove_control::launcher::wait_for_run_end(&connection, run_id, until));
        if !ended {
            tracing::warn!(
                "the other ranks had not all left run {run_id:?} after {within:?}: stopping its coordinator"
            );
        }
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            let stopped = self
                .runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await });
            if stopped.is_err() {
                tracing::warn!("rank 0's coordinator did not stop within 5 s");
            }
        }
    }
}

impl Drop for ServedCoordinator {
    fn drop(&mut self) {
        self.stop();
    }
}

//! The launcher's coordinator: one it serves in-process (on loopback, any free
//! port, on a temporary or given store) or one already running; and the calls
//! the launcher makes to it (is the run id free, has the run failed, every
//! rank leaves at the end).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use drove_control::{Authed, Clients, launcher};
use drove_proto::v1::rendezvous_client::RendezvousClient;

use crate::error::LaunchError;
use crate::launcher::spawn::SupervisorEvent;
use crate::launcher::supervise::Attempt;

/// Which coordinator the ranks meet at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorChoice {
    /// One served by the launcher on 127.0.0.1, with its store in this folder
    /// (kept) or in a temporary one (removed at the end).
    InProcess {
        /// The store folder to keep, if any.
        store: Option<PathBuf>,
        /// Where it also serves Prometheus' text format at `/metrics` (port
        /// 0: any free one; [`Console::note`](crate::Console::note) is told
        /// the address), as `drove coordinator --metrics-listen` does; none:
        /// not served.
        metrics_listen: Option<SocketAddr>,
    },
    /// One already running at this address (`host:port` or a URL).
    At(String),
}

/// The coordinator for a launch: its address and, if served in-process, the server.
pub(crate) struct LaunchCoordinator {
    pub addr: String,
    served: Option<(crate::serve::Server, Option<tempfile::TempDir>)>,
}

impl LaunchCoordinator {
    /// Serves one in-process, or names the given one.
    pub async fn open(choice: &CoordinatorChoice, token: Option<&str>) -> Result<Self, LaunchError> {
        let (store, metrics_listen) = match choice {
            CoordinatorChoice::At(addr) => return Ok(LaunchCoordinator { addr: addr.clone(), served: None }),
            CoordinatorChoice::InProcess { store, metrics_listen } => (store, *metrics_listen),
        };
        let (path, temporary) = match store {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    LaunchError::io(format!("creating the coordinator's store {}", dir.display()), e)
                })?;
                (dir.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("drove-run-store-")
                    .tempdir()
                    .map_err(|e| LaunchError::io("creating the coordinator's temporary store", e))?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let server = crate::serve::in_process(([127, 0, 0, 1], 0).into(), &path, token, metrics_listen)
            .await
            .map_err(|e| LaunchError::Coordinator(format!("starting the in-process coordinator: {e}")))?;
        Ok(LaunchCoordinator { addr: server.addr().to_string(), served: Some((server, temporary)) })
    }

    /// Where an in-process coordinator serves Prometheus metrics, if it does.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.served.as_ref().and_then(|(server, _)| server.metrics_addr())
    }

    /// Whether the launcher serves it.
    pub fn in_process(&self) -> bool {
        self.served.is_some()
    }

    /// Stops an in-process coordinator (waiting at most 5 s) and removes a temporary store.
    pub async fn close(self) {
        if let Some((server, store)) = self.served {
            if tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await.is_err() {
                tracing::warn!("the in-process coordinator did not stop within 5 s");
            }
            drop(store);
        }
    }
}

pub(crate) async fn check_run_is_free(clients: &mut Clients, run_id: &str) -> Result<(), LaunchError> {
    launcher::check_run_is_free(clients, run_id).await.map_err(|e| LaunchError::Coordinator(e.0))
}

pub(crate) async fn check_run_is_free_or_elastic(
    clients: &mut Clients,
    run_id: &str,
) -> Result<(), LaunchError> {
    launcher::check_run_is_free_or_elastic(clients, run_id).await.map_err(|e| LaunchError::Coordinator(e.0))
}

/// Reports once, on `tx`, that the coordinator failed the run (see
/// [`launcher::watch_run`]).
pub(crate) async fn watch_run(
    rendezvous: RendezvousClient<Authed>,
    run_id: String,
    tx: std::sync::mpsc::Sender<SupervisorEvent>,
) {
    launcher::watch_run(rendezvous, run_id, |error| drop(tx.send(SupervisorEvent::RunFailed(error)))).await
}

/// Every rank of `attempt` leaves (see [`launcher::leave_all`]).
pub(crate) async fn leave_all(clients: &mut Clients, run_id: &str, attempt: &Attempt) {
    let errors: Vec<String> = (0..attempt.statuses.len()).map(|rank| attempt.leave_error(rank)).collect();
    launcher::leave_all(clients, run_id, &errors).await
}

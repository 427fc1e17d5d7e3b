//! The launcher's coordinator: one it serves in-process (on loopback, any free
//! port, on a temporary or given store) or one already running; and the calls
//! the launcher makes to it (is the run id free, has the run failed, every
//! rank leaves at the end).

use std::path::PathBuf;
use std::time::Duration;

use drove_control::{Authed, Clients, Connection};
use drove_proto::v1::rendezvous_client::RendezvousClient;
use drove_proto::v1::{
    GenerationState, GenerationsRequest, HeartbeatRequest, LeaveRequest, LeaveResponse, RunState,
};
use tonic::Code;

use crate::error::LaunchError;
use crate::spawn::Event;
use crate::supervise::Attempt;

/// Which coordinator the ranks meet at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorChoice {
    /// One served by the launcher on 127.0.0.1, with its store in this folder
    /// (kept) or in a temporary one (removed at the end).
    InProcess {
        /// The store folder to keep, if any.
        store: Option<PathBuf>,
    },
    /// One already running at this address (`host:port` or a URL).
    At(String),
}

/// Deadline of each call the launcher makes to the coordinator.
const CALL_DEADLINE: Duration = Duration::from_secs(15);

/// The coordinator for a launch: its address and, if served in-process, the server.
pub(crate) struct LaunchCoordinator {
    pub addr: String,
    served: Option<(drove_coordinator::Server, Option<tempfile::TempDir>)>,
}

impl LaunchCoordinator {
    /// Serves one in-process, or names the given one.
    pub async fn open(choice: &CoordinatorChoice, token: Option<&str>) -> Result<Self, LaunchError> {
        let store = match choice {
            CoordinatorChoice::At(addr) => return Ok(LaunchCoordinator { addr: addr.clone(), served: None }),
            CoordinatorChoice::InProcess { store } => store,
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
        let config = drove_coordinator::Config {
            listen: ([127, 0, 0, 1], 0).into(),
            store: path,
            token: token.map(str::to_string),
            ..Default::default()
        };
        let server = drove_coordinator::start(&config)
            .await
            .map_err(|e| LaunchError::Coordinator(format!("starting the in-process coordinator: {e}")))?;
        Ok(LaunchCoordinator { addr: server.addr().to_string(), served: Some((server, temporary)) })
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

/// Connects to the coordinator at `addr` (`host:port` or a URL), with `token`
/// (if any) on every call, trusting the CA named by `DROVE_TLS_CA` for
/// `https://`. The error names the address and the cause.
pub async fn connect(addr: &str, token: Option<&str>) -> Result<Clients, LaunchError> {
    connection(addr, token).connect().await.map_err(|e| LaunchError::Coordinator(e.to_string()))
}

/// A channel to the coordinator at `addr`, without a token (for the health
/// service, say). The error names the address and the cause.
pub async fn connect_channel(addr: &str) -> Result<tonic::transport::Channel, LaunchError> {
    connection(addr, None).channel().await.map_err(|e| LaunchError::Coordinator(e.to_string()))
}

fn connection(addr: &str, token: Option<&str>) -> Connection {
    Connection::new(addr, token).with_tls_ca(std::env::var_os(crate::var::TLS_CA).map(PathBuf::from))
}

/// A gRPC status as one line naming its code, e.g.
/// `the coordinator refused the call (Unauthenticated): the bearer token is wrong`.
pub fn status_message(status: &tonic::Status) -> String {
    let code = status.code();
    let what = match code {
        Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Unauthenticated => "the coordinator refused the call",
        _ => "the call to the coordinator failed",
    };
    match status.message() {
        "" => format!("{what} ({code:?})"),
        message => format!("{what} ({code:?}): {message}"),
    }
}

/// Checks that the token is accepted and that no live run has this id (its
/// ranks would find the run full). A finished or failed run id may be reused.
pub(crate) async fn check_run_is_free(clients: &mut Clients, run_id: &str) -> Result<(), LaunchError> {
    let probe = clients.rendezvous.heartbeat(observe(run_id));
    match tokio::time::timeout(CALL_DEADLINE, probe).await {
        Err(_) => Err(LaunchError::Coordinator("the coordinator did not answer within 15 s".into())),
        Ok(Err(s)) if s.code() == Code::NotFound => Ok(()),
        Ok(Err(s)) => Err(LaunchError::Coordinator(status_message(&s))),
        Ok(Ok(r)) => match r.into_inner().state() {
            RunState::Finished | RunState::Failed => Ok(()),
            state => Err(LaunchError::Coordinator(format!(
                "run {run_id:?} is already {state} on the coordinator; choose another --run-id"
            ))),
        },
    }
}

/// [`check_run_is_free`], except that a live elastic run (one with
/// generations) may be joined: an elastic launch adds its ranks to it.
pub(crate) async fn check_run_is_free_or_elastic(
    clients: &mut Clients,
    run_id: &str,
) -> Result<(), LaunchError> {
    let listed = clients.rendezvous.generations(GenerationsRequest { run_id: run_id.to_string() });
    match tokio::time::timeout(CALL_DEADLINE, listed).await {
        Ok(Ok(r)) if !r.get_ref().generations.is_empty() => {
            let ended = r.get_ref().generations.last().is_some_and(|g| g.state() == GenerationState::Ended);
            if !ended {
                tracing::info!("run {run_id:?} is a live elastic run: adding this launch's ranks to it");
                return Ok(());
            }
            check_run_is_free(clients, run_id).await
        }
        _ => check_run_is_free(clients, run_id).await,
    }
}

/// The run's state on the coordinator: `None` if it does not know the run;
/// `Unspecified` if it did not answer.
pub(crate) async fn run_state(clients: &mut Clients, run_id: &str) -> Option<RunState> {
    match tokio::time::timeout(CALL_DEADLINE, clients.rendezvous.heartbeat(observe(run_id))).await {
        Ok(Ok(reply)) => Some(reply.into_inner().state()),
        Ok(Err(s)) if s.code() == Code::NotFound => None,
        _ => Some(RunState::Unspecified),
    }
}

fn observe(run_id: &str) -> HeartbeatRequest {
    HeartbeatRequest { run_id: run_id.to_string(), rank: 0, observer: true, ..Default::default() }
}

/// Asks the coordinator for the run's state every second, and reports once if
/// it failed the run with a reason (a hung rank) after this attempt's world
/// was seen running; a coordinator that is away (restarting) is asked again
/// at the next tick.
pub(crate) async fn watch_run(
    mut rendezvous: RendezvousClient<Authed>,
    run_id: String,
    tx: std::sync::mpsc::Sender<Event>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running = false;
    loop {
        tick.tick().await;
        let probe = rendezvous.heartbeat(observe(&run_id));
        if let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(5), probe).await {
            let reply = reply.into_inner();
            running |= reply.state() == RunState::Running;
            if running && reply.state() == RunState::Failed && !reply.error.is_empty() {
                let _ = tx.send(Event::RunFailed(reply.error));
                return;
            }
        }
    }
}

/// Tells the coordinator that every rank left (with an error for failed ones).
/// Each call is retried for up to 15 s while the coordinator is unavailable (a
/// restart), so the run ends finished or failed there all the same.
pub(crate) async fn leave_all(clients: &mut Clients, run_id: &str, attempt: &Attempt) {
    for rank in 0..attempt.statuses.len() {
        let request = LeaveRequest {
            run_id: run_id.to_string(),
            rank: rank as i32,
            error: attempt.leave_error(rank),
            ..Default::default()
        };
        match leave_retrying(&mut clients.rendezvous, request, CALL_DEADLINE).await {
            Ok(Ok(_)) => {}
            Ok(Err(s)) if s.code() == Code::NotFound => {
                tracing::debug!("run {run_id:?} never joined the coordinator");
                return;
            }
            Ok(Err(s)) => {
                tracing::warn!("rank {rank} could not leave run {run_id:?}: {}", status_message(&s))
            }
            Err(_) => {
                tracing::warn!("the coordinator did not answer Leave within 15 s");
                return;
            }
        }
    }
}

/// One Leave, retried after 0.2 s, 0.4 s, ... (at most 2 s apart) while the
/// coordinator is unavailable, until `limit` passes (then `Err`).
async fn leave_retrying(
    rendezvous: &mut RendezvousClient<Authed>,
    request: LeaveRequest,
    limit: Duration,
) -> Result<Result<tonic::Response<LeaveResponse>, tonic::Status>, tokio::time::error::Elapsed> {
    tokio::time::timeout(limit, async {
        let mut wait = Duration::from_millis(200);
        loop {
            match rendezvous.leave(request.clone()).await {
                Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown) => {
                    tracing::debug!("Leave: {} ({:?}); retrying in {wait:?}", s.message(), s.code());
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    })
    .await
}

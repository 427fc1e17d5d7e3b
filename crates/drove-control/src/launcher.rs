//! The launcher's calls to a coordinator: is the run id free, what state is
//! the run in, has the coordinator failed it, every rank leaves at the end,
//! and waiting for a run to end (rank 0's served coordinator).

use std::time::{Duration, Instant};

use drove_proto::v1::rendezvous_client::RendezvousClient;
use drove_proto::v1::{
    GenerationState, GenerationsRequest, HeartbeatRequest, LeaveRequest, LeaveResponse, RunState,
};
use tonic::Code;

use crate::connect::{Authed, Clients, Connection};

/// Deadline of each call the launcher makes to the coordinator.
pub const CALL_DEADLINE: Duration = Duration::from_secs(15);

/// A launcher's call the coordinator refused or did not answer: one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct LauncherError(pub String);

/// A gRPC status as one line naming its code, e.g.
/// `the coordinator refused the call (Unauthenticated): the bearer token is wrong`.
pub fn status_message(status: &tonic::Status) -> String {
    status_line(status.code(), status.message())
}

/// [`status_message`] of a status's code and message.
pub(crate) fn status_line(code: Code, message: &str) -> String {
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
    match message {
        "" => format!("{what} ({code:?})"),
        message => format!("{what} ({code:?}): {message}"),
    }
}

/// Checks that the token is accepted and that no live run has this id (its
/// ranks would find the run full). A finished or failed run id may be reused.
pub async fn check_run_is_free(clients: &mut Clients, run_id: &str) -> Result<(), LauncherError> {
    let probe = clients.rendezvous.heartbeat(observe(run_id));
    match tokio::time::timeout(CALL_DEADLINE, probe).await {
        Err(_) => Err(LauncherError("the coordinator did not answer within 15 s".into())),
        Ok(Err(s)) if s.code() == Code::NotFound => Ok(()),
        Ok(Err(s)) => Err(LauncherError(status_message(&s))),
        Ok(Ok(r)) => match r.into_inner().state() {
            RunState::Finished | RunState::Failed => Ok(()),
            state => Err(LauncherError(format!(
                "run {run_id:?} is already {state} on the coordinator; choose another --run-id"
            ))),
        },
    }
}

/// [`check_run_is_free`], except that a live elastic run (one with
/// generations) may be joined: an elastic launch adds its ranks to it.
pub async fn check_run_is_free_or_elastic(clients: &mut Clients, run_id: &str) -> Result<(), LauncherError> {
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
pub async fn run_state(clients: &mut Clients, run_id: &str) -> Option<RunState> {
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
/// at the next tick; `on_failed` gets the reason. It ends only then.
pub async fn watch_run(
    mut rendezvous: RendezvousClient<Authed>,
    run_id: String,
    on_failed: impl FnOnce(String),
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
                on_failed(reply.error);
                return;
            }
        }
    }
}

/// Tells the coordinator that every rank left (`errors[rank]`: empty, or why
/// that rank failed).
/// Each call is retried for up to 15 s while the coordinator is unavailable (a
/// restart), so the run ends finished or failed there all the same.
pub async fn leave_all(clients: &mut Clients, run_id: &str, errors: &[String]) {
    for (rank, error) in errors.iter().enumerate() {
        let request = LeaveRequest {
            run_id: run_id.to_string(),
            rank: rank as i32,
            error: error.clone(),
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

/// Waits until run `run_id` on the coordinator of `connection` has ended
/// (every rank left, it failed, or the coordinator does not know it), asking
/// every 0.1 s until `until`; whether it ended.
pub async fn wait_for_run_end(connection: &Connection, run_id: &str, until: Instant) -> bool {
    let Ok(mut clients) = connection.connect().await else { return false };
    loop {
        match run_state(&mut clients, run_id).await {
            Some(RunState::Finished | RunState::Failed) | None => return true,
            Some(_) if Instant::now() >= until => return false,
            Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

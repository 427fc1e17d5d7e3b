//! The Rendezvous service: runs fill up with workers, who get ranks and the peer
//! table once the world is complete.

use std::time::{Duration, Instant};

use drove_proto::v1::rendezvous_server::Rendezvous;
use drove_proto::v1::{
    GenerationsRequest, GenerationsResponse, GetKeyRequest, GetKeyResponse, HeartbeatRequest,
    HeartbeatResponse, JoinRequest, JoinResponse, LeaveRequest, LeaveResponse, PutKeyRequest, PutKeyResponse,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::run_state::RunState;
use crate::validate::{check_rank, check_run_id, check_world_size, internal};

mod elastic;
mod elastic_run;
mod keys;
mod service;

pub use service::RendezvousService;
use service::{MemberAddress, Run};

/// Checks a join request on its own, before any run is looked at; returns how
/// long the join waits for its world.
fn check_join(req: &JoinRequest, default_timeout: Duration) -> Result<Duration, Status> {
    check_run_id(&req.run_id, "run_id")?;
    if req.max_size == 0 {
        check_world_size(req.world_size, "world_size")?;
    }
    if req.address.is_empty() {
        return Err(Status::invalid_argument(
            "address must be the worker's data-plane host:port, found empty",
        ));
    }
    if req.restart_count < 0 {
        return Err(Status::invalid_argument(format!(
            "restart_count must be >= 0, found {}",
            req.restart_count
        )));
    }
    if req.timeout_ms < 0 {
        return Err(Status::invalid_argument(format!("timeout_ms must be >= 0, found {}", req.timeout_ms)));
    }
    Ok(if req.timeout_ms == 0 { default_timeout } else { Duration::from_millis(req.timeout_ms as u64) })
}

/// A join's parts: [`check_join`] (the request alone), then under the run
/// lock the place ([`Run::rank_for`]), the transition ([`RunState::on_join`])
/// and the store ([`RendezvousService::persist_join`]), then the wait.
impl RendezvousService {
    /// Gives a checked join its place in its run (a run id that has ended
    /// starts over) and moves the run's state on; returns the rank and a
    /// receiver of the run's changes. The store is written before the lock is
    /// released: two joins racing must not store their states in the other
    /// order (the last join's running overwritten by the first one's rendezvous).
    fn admit(&self, req: &JoinRequest) -> Result<(usize, watch::Receiver<u64>), Status> {
        let world = req.world_size as usize;
        let mut guard = self.lock();
        let runs = &mut *guard;
        self.forget_ended_elastic(runs, req)?;
        let runs = &mut runs.fixed;
        let mut fresh = !runs.contains_key(&req.run_id);
        let run = runs.entry(req.run_id.clone()).or_insert_with(|| Run::new(world));
        if run.state.has_ended() {
            *run = Run::new(world); // a finished run id may rendezvous again (a resumed job)
            fresh = true;
        }
        let rank = run.rank_for(req)?;
        run.members[rank] = Some(MemberAddress { address: req.address.clone(), host: req.host.clone() });
        run.state = run.state.on_join(run.joined(), world).map_err(internal)?;
        self.persist_join(req, rank, fresh, run)?;
        run.changed.send_modify(|v| *v += 1);
        Ok((rank, run.changed.subscribe()))
    }

    /// Stores a join: the run's earlier workers forgotten if its id starts
    /// over (`fresh`), the worker at `rank`, the run's state and size, and the
    /// launcher's restart count.
    fn persist_join(&self, req: &JoinRequest, rank: usize, fresh: bool, run: &Run) -> Result<(), Status> {
        if fresh {
            self.store.remove_members(&req.run_id, None).map_err(internal)?;
        }
        self.store.put_member(&req.run_id, rank as i32, &req.address, &req.host).map_err(internal)?;
        self.persist(&req.run_id, run.state, run.world_size, run.joined())?;
        if req.restart_count > 0 {
            self.store.record_restarts(&req.run_id, req.restart_count).map_err(internal)?;
        }
        Ok(())
    }

    /// Waits up to `timeout` for the world of the join at `rank` to fill, and
    /// answers its rank and the peer table; a join whose world does not fill
    /// in time gives its place back and says who else is waiting.
    async fn wait_for_world(
        &self,
        req: &JoinRequest,
        rank: usize,
        mut changed: watch::Receiver<u64>,
        timeout: Duration,
    ) -> Result<Response<JoinResponse>, Status> {
        let wait = async {
            loop {
                {
                    let runs = self.lock();
                    if let Some(peers) = runs.fixed.get(&req.run_id).and_then(Run::peers) {
                        return Ok(peers);
                    }
                }
                if changed.changed().await.is_err() {
                    return Err(Status::aborted(format!("run {:?} was reset while waiting", req.run_id)));
                }
            }
        };
        let world = req.world_size as usize;
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(peers)) => Ok(Response::new(JoinResponse {
                rank: rank as i32,
                local_rank: peers[rank].local_rank,
                world_size: world as i32,
                peers,
                generation: 0,
            })),
            Ok(Err(status)) => Err(status),
            Err(_) => {
                let (joined, ranks) = self.withdraw(req, rank);
                Err(Status::deadline_exceeded(format!(
                    "run {:?}: the world did not fill within {:.1?}: only {} of {world} workers joined (ranks {:?} still waiting besides this one)",
                    req.run_id,
                    timeout,
                    joined + 1,
                    ranks
                )))
            }
        }
    }

    /// Leaves the run again after a join timed out, so that a retry (or
    /// another worker) can take the place: only while the run is in
    /// rendezvous and the place still holds this worker. Returns the number of
    /// workers in the run and their ranks.
    fn withdraw(&self, req: &JoinRequest, rank: usize) -> (usize, Vec<usize>) {
        let world = req.world_size as usize;
        let mut runs = self.lock();
        let Some(run) = runs.fixed.get_mut(&req.run_id) else {
            return (0, Vec::new()); // an elastic join took the ended run's id
        };
        if run.members[rank].as_ref().is_some_and(|m| m.address == req.address)
            && let Ok(state) = run.state.on_withdraw()
        {
            run.state = state;
            run.members[rank] = None;
            let _ = self.store.remove_members(&req.run_id, Some(rank as i32));
            let _ = self.persist(&req.run_id, run.state, world, run.joined());
            run.changed.send_modify(|v| *v += 1);
        }
        let ranks: Vec<usize> = (0..world).filter(|&r| run.members[r].is_some()).collect();
        (run.joined(), ranks)
    }
}

impl RendezvousService {
    /// Fails every running run with a rank that sent heartbeats and then none
    /// for `timeout`, naming the rank and its host; returns those runs.
    pub fn fail_silent_ranks(&self, timeout: Duration) -> Vec<(String, String)> {
        let mut failed = Vec::new();
        {
            let mut runs = self.lock();
            self.lose_silent_members(&mut runs.elastic, timeout);
            for (run_id, run) in runs.fixed.iter_mut() {
                let Ok(next) = run.state.on_silence() else { continue };
                let silent = (0..run.world_size)
                    .find(|&r| !run.left[r] && run.heartbeats[r].is_some_and(|at| at.elapsed() >= timeout));
                if let Some(r) = silent {
                    let host = run.members[r].as_ref().map_or("?", |m| m.host.as_str());
                    let since = run.heartbeats[r].map_or(Duration::ZERO, |at| at.elapsed());
                    run.error = format!(
                        "rank {r} on host {host} sent no heartbeat for {:.1} s (hung or stopped; the limit is {:.1} s)",
                        since.as_secs_f64(),
                        timeout.as_secs_f64()
                    );
                    run.state = next;
                    run.failed = true;
                    tracing::warn!(run = %run_id, "{}", run.error);
                    // Under the lock, in order with the joins and leaves.
                    let _ = self.store.member_left(run_id, r as i32, &run.error);
                    let _ = self.persist(run_id, run.state, run.world_size, run.joined());
                    failed.push((run_id.clone(), run.error.clone()));
                }
            }
        }
        failed
    }
}

#[tonic::async_trait]
impl Rendezvous for RendezvousService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let req = request.into_inner();
        let timeout = check_join(&req, self.default_timeout)?;
        if req.max_size != 0 {
            return self.join_elastic(&req, timeout).await;
        }
        let (rank, changed) = self.admit(&req)?;
        self.wait_for_world(&req, rank, changed, timeout).await
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let req = request.into_inner();
        check_run_id(&req.run_id, "run_id")?;
        if let Some(response) = self.heartbeat_elastic(&req)? {
            return Ok(Response::new(response));
        }
        let response = {
            let mut runs = self.lock();
            let run = runs
                .fixed
                .get_mut(&req.run_id)
                .ok_or_else(|| Status::not_found(format!("no run {:?}", req.run_id)))?;
            if !req.observer {
                let rank = check_rank(req.rank, run.world_size, "rank")?;
                run.heartbeats[rank] = Some(Instant::now());
            }
            HeartbeatResponse {
                state: drove_proto::v1::RunState::from(run.state).into(),
                error: run.error.clone(),
                ..Default::default()
            }
        };
        if !req.observer {
            self.store.heartbeat(&req.run_id, req.rank, crate::store::now_ms()).map_err(internal)?;
        }
        Ok(Response::new(response))
    }

    async fn leave(&self, request: Request<LeaveRequest>) -> Result<Response<LeaveResponse>, Status> {
        let req = request.into_inner();
        check_run_id(&req.run_id, "run_id")?;
        if self.leave_elastic(&req)? {
            return Ok(Response::new(LeaveResponse {}));
        }
        {
            let mut runs = self.lock();
            let Some(run) = runs.fixed.get_mut(&req.run_id) else {
                // Its workers never joined (they died first, or this coordinator
                // restarted): record how the run ended all the same.
                drop(runs);
                self.persist(&req.run_id, RunState::ended(!req.error.is_empty()), 0, 0)?;
                return Ok(Response::new(LeaveResponse {}));
            };
            let rank = check_rank(req.rank, run.world_size, "rank")?;
            run.left[rank] = true;
            if !req.error.is_empty() {
                run.failed = true;
                tracing::warn!(run = %req.run_id, rank, error = %req.error, "worker left with an error");
            }
            run.state = run.state.on_leave(run.left.iter().all(|&l| l), run.failed);
            // Under the lock, so that racing leaves store their states in order
            // (the last leave's "finished" is never overwritten by "running").
            self.store.member_left(&req.run_id, req.rank, &req.error).map_err(internal)?;
            self.persist(&req.run_id, run.state, run.world_size, run.joined())?;
        }
        Ok(Response::new(LeaveResponse {}))
    }

    async fn put_key(&self, request: Request<PutKeyRequest>) -> Result<Response<PutKeyResponse>, Status> {
        let req = request.into_inner();
        check_run_id(&req.run_id, "run_id")?;
        if req.key.is_empty() {
            return Err(Status::invalid_argument("key must not be empty"));
        }
        if req.value.len() > 1 << 20 {
            return Err(Status::invalid_argument(format!(
                "value of {} bytes exceeds the 1 MiB limit",
                req.value.len()
            )));
        }
        let mut runs = self.lock();
        let keys =
            runs.keys(&req.run_id).ok_or_else(|| Status::not_found(format!("no run {:?}", req.run_id)))?;
        keys.values.insert(req.key, req.value);
        keys.changed.send_modify(|v| *v += 1);
        Ok(Response::new(PutKeyResponse {}))
    }

    async fn get_key(&self, request: Request<GetKeyRequest>) -> Result<Response<GetKeyResponse>, Status> {
        let req = request.into_inner();
        check_run_id(&req.run_id, "run_id")?;
        if req.wait_ms < 0 {
            return Err(Status::invalid_argument(format!("wait_ms must be >= 0, found {}", req.wait_ms)));
        }
        let mut changed = {
            let mut runs = self.lock();
            let keys = runs
                .keys(&req.run_id)
                .ok_or_else(|| Status::not_found(format!("no run {:?}", req.run_id)))?;
            if let Some(v) = keys.values.get(&req.key) {
                return Ok(Response::new(GetKeyResponse { value: v.clone() }));
            }
            keys.changed.subscribe()
        };
        let wait = async {
            loop {
                if changed.changed().await.is_err() {
                    return None;
                }
                let mut runs = self.lock();
                if let Some(v) = runs.keys(&req.run_id).and_then(|k| k.values.get(&req.key)) {
                    return Some(v.clone());
                }
            }
        };
        match tokio::time::timeout(Duration::from_millis(req.wait_ms as u64), wait).await {
            Ok(Some(value)) => Ok(Response::new(GetKeyResponse { value })),
            _ => Err(Status::not_found(format!(
                "run {:?} has no key {:?} (waited {} ms)",
                req.run_id, req.key, req.wait_ms
            ))),
        }
    }

    async fn generations(
        &self,
        request: Request<GenerationsRequest>,
    ) -> Result<Response<GenerationsResponse>, Status> {
        let req = request.into_inner();
        check_run_id(&req.run_id, "run_id")?;
        Ok(Response::new(GenerationsResponse { generations: self.list_generations(&req.run_id)? }))
    }
}

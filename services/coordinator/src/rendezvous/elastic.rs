//! The elastic half of the Rendezvous service: joins with `max_size` > 0 go
//! through the run's [`Generations`] (the transitions live there),
//! under the same lock as fixed runs, each change written to the store
//! before the lock is released, and joins wait on the run's watch channel
//! plus a timer for the forming generation's settle time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drove_proto::v1::{
    HeartbeatRequest, HeartbeatResponse, JoinRequest, JoinResponse, LeaveRequest, MemberBeat,
};
use tokio::sync::watch;
use tonic::{Response, Status};

use super::elastic_run::ElasticRun;
use super::service::{RendezvousService, Runs};
use crate::generations::{
    DEFAULT_SETTLE, GenerationEnding, GenerationError, GenerationState, Generations, MemberJoin,
};
use crate::store::now_ms;
use crate::validate::{MAX_WORLD_SIZE, internal};

/// One join call waiting for its generation; counted in its run's
/// `waiting` until dropped (answered, timed out, or cancelled by the client).
struct Waiting {
    runs: Arc<Mutex<Runs>>,
    run_id: String,
    member_id: String,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(run) = runs.elastic.get_mut(&self.run_id)
            && let Some(n) = run.waiting.get_mut(&self.member_id)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                run.waiting.remove(&self.member_id);
            }
        }
    }
}

/// Checks the elastic fields of a join (`max_size` > 0) on their own.
fn check_elastic(req: &JoinRequest) -> Result<MemberJoin, Status> {
    let at = format!("run {:?}, member {:?}", req.run_id, req.member_id);
    let invalid = |what: String| Err(Status::invalid_argument(format!("{at}: {what}")));
    if req.member_id.is_empty() {
        return invalid(
            "member_id must name the member (a pod's index, a launcher's slot), found empty".into(),
        );
    }
    if req.member_id.len() > 128 {
        return invalid(format!("member_id is {} characters long, more than 128", req.member_id.len()));
    }
    if !(1..=MAX_WORLD_SIZE).contains(&req.min_size) {
        return invalid(format!("min_size must be 1 to {MAX_WORLD_SIZE}, found {}", req.min_size));
    }
    if !(1..=MAX_WORLD_SIZE).contains(&req.max_size) {
        return invalid(format!("max_size must be 1 to {MAX_WORLD_SIZE}, found {}", req.max_size));
    }
    if req.min_size > req.max_size {
        return invalid(format!(
            "min_size must be at most max_size, found min_size {} > max_size {}",
            req.min_size, req.max_size
        ));
    }
    for (field, value) in
        [("after_generation", req.after_generation), ("settle_ms", req.settle_ms), ("step", req.step)]
    {
        if value < 0 {
            return invalid(format!("{field} must be >= 0, found {value}"));
        }
    }
    Ok(MemberJoin {
        member_id: req.member_id.clone(),
        address: req.address.clone(),
        host: req.host.clone(),
        min: req.min_size as usize,
        max: req.max_size as usize,
        after: req.after_generation,
        settle: if req.settle_ms == 0 { DEFAULT_SETTLE } else { Duration::from_millis(req.settle_ms as u64) },
        step: req.step,
        cause: req.cause.as_ref().map_or(
            GenerationEnding::of(drove_proto::v1::EndKind::Unspecified, &[]),
            GenerationEnding::from_proto,
        ),
    })
}

/// Joins.
impl RendezvousService {
    /// An elastic join: checked, admitted to the forming generation, then
    /// waiting for it to close.
    pub(super) async fn join_elastic(
        &self,
        req: &JoinRequest,
        timeout: Duration,
    ) -> Result<Response<JoinResponse>, Status> {
        let j = check_elastic(req)?;
        let (number, changed) = self.admit_elastic(req, &j)?;
        let _waiting =
            Waiting { runs: self.runs.clone(), run_id: req.run_id.clone(), member_id: j.member_id.clone() };
        self.wait_for_generation(req, number, changed, timeout).await
    }

    /// A fixed join to a run id that is elastic: refused while the elastic
    /// run lives, its generations forgotten once it has ended (the id starts over).
    pub(super) fn forget_ended_elastic(&self, runs: &mut Runs, req: &JoinRequest) -> Result<(), Status> {
        let Some(run) = runs.elastic.get(&req.run_id) else { return Ok(()) };
        if run.gens.outcome().is_none() {
            return Err(Status::invalid_argument(format!(
                "run {:?} is elastic (min_size {}, max_size {}); this join has max_size 0, a fixed world_size {}: every join of a run must be elastic or fixed alike",
                req.run_id, run.gens.min, run.gens.max, req.world_size
            )));
        }
        runs.elastic.remove(&req.run_id);
        self.store.remove_generations(&req.run_id).map_err(internal)
    }

    /// Gives a checked elastic join its place in the forming generation (a
    /// run that has ended starts over) and closes it if it may; returns its
    /// number and a receiver of the run's changes.
    fn admit_elastic(
        &self,
        req: &JoinRequest,
        j: &MemberJoin,
    ) -> Result<(i64, watch::Receiver<u64>), Status> {
        let mut guard = self.lock();
        let runs = &mut *guard;
        if let Some(fixed) = runs.fixed.get(&req.run_id) {
            if !fixed.state.has_ended() {
                return Err(Status::invalid_argument(format!(
                    "run {:?} is a fixed world of {} workers (max_size 0); this join of member {:?} has max_size {}: every join of a run must be elastic or fixed alike",
                    req.run_id, fixed.world_size, req.member_id, req.max_size
                )));
            }
            runs.fixed.remove(&req.run_id);
            self.store.remove_members(&req.run_id, None).map_err(internal)?;
        }
        // A member of an earlier world of a run that ended without it was
        // left out (stopped past the others' deadline): it does not start the id over.
        if j.after > 0
            && let Some(outcome) = runs.elastic.get(&req.run_id).and_then(|run| run.gens.outcome())
        {
            return Err(Status::failed_precondition(format!(
                "member {:?} was left out of run {:?}: the run has {outcome} without it (it was last in generation {})",
                j.member_id, req.run_id, j.after
            )));
        }
        // A run that ended (or never got a generation) starts over with this join's sizes.
        let over = |run: &ElasticRun| run.gens.generations.is_empty() || run.gens.outcome().is_some();
        if runs.elastic.get(&req.run_id).is_none_or(over) {
            self.store.remove_generations(&req.run_id).map_err(internal)?;
            runs.elastic.insert(req.run_id.clone(), ElasticRun::new(&req.run_id, j.min, j.max));
        }
        let run = runs.elastic.get_mut(&req.run_id).expect("inserted above");
        let (now, now_ms) = (Instant::now(), now_ms());
        let number = run.gens.join(j, now, now_ms).map_err(status)?;
        run.gens.try_close(now, now_ms);
        self.persist_elastic(run)?;
        if req.restart_count > 0 {
            self.store.record_restarts(&req.run_id, req.restart_count).map_err(internal)?;
        }
        *run.waiting.entry(j.member_id.clone()).or_default() += 1;
        tracing::info!(run = %req.run_id, member = %j.member_id, generation = number, "member joined");
        Ok((number, run.changed.subscribe()))
    }

    /// Stores the run's changed generations and its row, then wakes its
    /// waiting joins; called under the run lock, so writes are in order.
    fn persist_elastic(&self, run: &mut ElasticRun) -> Result<(), Status> {
        let gens = &mut run.gens;
        let (state, world, joined) =
            (gens.run_state(), gens.world(), gens.generations.last().map_or(0, |g| g.world_size()));
        let (run_id, min, max) = (gens.run_id.clone(), gens.min, gens.max);
        for g in gens.take_changed() {
            self.store.put_generation(&run_id, min, max, g).map_err(internal)?;
        }
        self.persist(&run_id, state, world, joined)?;
        run.changed.send_modify(|v| *v += 1);
        Ok(())
    }

    /// Waits up to `timeout` for generation `number` to close, and answers
    /// the member's rank and its peer table; a join whose generation does
    /// not close in time is withdrawn from it and says who joined and who
    /// was lost.
    async fn wait_for_generation(
        &self,
        req: &JoinRequest,
        number: i64,
        mut changed: watch::Receiver<u64>,
        timeout: Duration,
    ) -> Result<Response<JoinResponse>, Status> {
        let reset = || Status::aborted(format!("run {:?} was reset while waiting", req.run_id));
        let wait = async {
            loop {
                let settle = match self.poll_generation(req, number)? {
                    Ok(response) => return Ok(Response::new(response)),
                    Err(settle) => settle,
                };
                let woken = match settle {
                    Some(at) => tokio::select! {
                        r = changed.changed() => r,
                        () = tokio::time::sleep_until(at.into()) => Ok(()),
                    },
                    None => changed.changed().await,
                };
                woken.map_err(|_| reset())?;
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(answer) => answer,
            Err(_) => Err(self.withdraw_elastic(req, number, timeout)),
        }
    }

    /// Closes the forming generation if it may now, then answers the
    /// member's world if generation `number` runs, else when its settle
    /// time passes (if that is what it waits for).
    fn poll_generation(
        &self,
        req: &JoinRequest,
        number: i64,
    ) -> Result<Result<JoinResponse, Option<Instant>>, Status> {
        let mut runs = self.lock();
        let Some(run) = runs.elastic.get_mut(&req.run_id) else {
            return Err(Status::aborted(format!("run {:?} was reset while waiting", req.run_id)));
        };
        if run.gens.try_close(Instant::now(), now_ms()) {
            tracing::info!(run = %req.run_id, generation = number, world = run.gens.world(), "generation formed");
            self.persist_elastic(run)?;
        }
        if let Some((rank, peers)) = run.gens.world_of(number, &req.member_id) {
            return Ok(Ok(JoinResponse {
                rank: rank as i32,
                local_rank: peers[rank].local_rank,
                world_size: peers.len() as i32,
                peers,
                generation: number,
            }));
        }
        let at = format!("run {:?}, member {:?}", req.run_id, req.member_id);
        match run.gens.generation(number) {
            Some(g) if g.state == GenerationState::Ended => Err(Status::failed_precondition(format!(
                "{at}: generation {number} ended before it formed: {}",
                g.end.as_ref().map_or("", |e| e.detail.as_str())
            ))),
            Some(g) if g.member(&req.member_id).is_some() => Ok(Err(run.gens.settle_deadline())),
            _ => Err(Status::aborted(format!("{at}: no longer in forming generation {number} (it left)"))),
        }
    }

    /// Withdraws a join that timed out from its forming generation; the
    /// error says who joined, who of the generation before was lost, and the minimum.
    fn withdraw_elastic(&self, req: &JoinRequest, number: i64, timeout: Duration) -> Status {
        let mut runs = self.lock();
        let Some(run) = runs.elastic.get_mut(&req.run_id) else {
            return Status::aborted(format!("run {:?} was reset while waiting", req.run_id));
        };
        let shortfall = run.gens.shortfall(number);
        let others_wait = run.waiting.get(&req.member_id).is_some_and(|&n| n > 1);
        if !others_wait && run.gens.withdraw(number, &req.member_id, &req.address) {
            let _ = self.persist_elastic(run);
        }
        Status::deadline_exceeded(format!(
            "run {:?}, member {:?}: generation {number} did not form within {timeout:.1?}: {shortfall}",
            req.run_id, req.member_id
        ))
    }
}

/// Heartbeats, leaves, the watchdog, the listing.
impl RendezvousService {
    /// A heartbeat of an elastic run's member, or an observer's of an
    /// elastic run; none if the heartbeat is a fixed run's.
    pub(super) fn heartbeat_elastic(
        &self,
        req: &HeartbeatRequest,
    ) -> Result<Option<HeartbeatResponse>, Status> {
        let mut runs = self.lock();
        let runs = &mut *runs;
        let Some(run) = runs.elastic.get_mut(&req.run_id) else {
            if !req.member_id.is_empty() && runs.fixed.contains_key(&req.run_id) {
                return Err(Status::invalid_argument(format!(
                    "run {:?} is a fixed world: a heartbeat names its rank, found member_id {:?}",
                    req.run_id, req.member_id
                )));
            }
            if !req.member_id.is_empty() {
                return Err(Status::not_found(format!("no run {:?}", req.run_id)));
            }
            return Ok(None);
        };
        let mut response = HeartbeatResponse {
            state: drove_proto::v1::RunState::from(run.gens.run_state()).into(),
            error: run.gens.failure().map(|e| e.detail.clone()).unwrap_or_default(),
            generation: run.gens.newest(),
            ..Default::default()
        };
        if req.observer {
            return Ok(Some(response));
        }
        if req.member_id.is_empty() {
            return Err(Status::invalid_argument(format!(
                "run {:?} is elastic: a heartbeat must name its member_id, found none (rank {})",
                req.run_id, req.rank
            )));
        }
        let beat = run.gens.heartbeat(&req.member_id, req.generation, Instant::now()).map_err(status)?;
        response.reform = beat.reform;
        response.reform_cause = beat.cause.as_ref().map(GenerationEnding::to_proto);
        response.member_beats = member_beats(&run.gens, req.generation, Instant::now());
        Ok(Some(response))
    }

    /// A leave of an elastic run's member; false if the leave is a fixed
    /// run's (or one of a run this coordinator does not hold).
    pub(super) fn leave_elastic(&self, req: &LeaveRequest) -> Result<bool, Status> {
        let mut runs = self.lock();
        let runs = &mut *runs;
        let Some(run) = runs.elastic.get_mut(&req.run_id) else {
            if !req.member_id.is_empty() && runs.fixed.contains_key(&req.run_id) {
                return Err(Status::invalid_argument(format!(
                    "run {:?} is a fixed world: a leave names its rank, found member_id {:?}",
                    req.run_id, req.member_id
                )));
            }
            return Ok(false);
        };
        if req.member_id.is_empty() {
            return Err(Status::invalid_argument(format!(
                "run {:?} is elastic: a leave must name its member_id, found none (rank {})",
                req.run_id, req.rank
            )));
        }
        if req.step < 0 {
            return Err(Status::invalid_argument(format!("step must be >= 0, found {}", req.step)));
        }
        run.gens.leave(&req.member_id, req.step, &req.error, now_ms()).map_err(status)?;
        if !req.error.is_empty() {
            tracing::warn!(run = %req.run_id, member = %req.member_id, error = %req.error, "member left with an error");
        }
        self.persist_elastic(run)?;
        Ok(true)
    }

    /// The watchdog's part for elastic runs: a member of a running
    /// generation that fell silent is named lost (once, logged), and the
    /// others are told to re-form; the run does not fail.
    pub(super) fn lose_silent_members(&self, runs: &mut HashMap<String, ElasticRun>, timeout: Duration) {
        for (run_id, run) in runs.iter_mut() {
            let lost = run.gens.lose_silent(timeout, Instant::now());
            if lost.is_empty() {
                continue;
            }
            tracing::warn!(
                run = %run_id,
                ?lost,
                "members sent no heartbeat for {:.1} s: named lost, the others re-form",
                timeout.as_secs_f64()
            );
            let _ = self.persist_elastic(run);
        }
    }

    /// A run's generations, oldest first: from memory, else the store (an
    /// ended run); none for a fixed-world run; NOT_FOUND for a run never seen.
    pub(super) fn list_generations(&self, run_id: &str) -> Result<Vec<drove_proto::v1::Generation>, Status> {
        {
            let runs = self.lock();
            if let Some(run) = runs.elastic.get(run_id) {
                return Ok(run.gens.generations.iter().map(|g| g.to_proto()).collect());
            }
            if runs.fixed.contains_key(run_id) {
                return Ok(Vec::new());
            }
        }
        if let Some((_, _, generations)) = self.store.generations(run_id).map_err(internal)? {
            return Ok(generations.iter().map(|g| g.to_proto()).collect());
        }
        if self.store.has_run(run_id).map_err(internal)? {
            return Ok(Vec::new());
        }
        Err(Status::not_found(format!("no run {run_id:?}")))
    }
}

/// How long ago each member of `generation` last sent a heartbeat (the ones
/// heard from since this coordinator started).
fn member_beats(gens: &Generations, generation: i64, now: Instant) -> Vec<MemberBeat> {
    let Some(g) = gens.generation(generation) else { return Vec::new() };
    g.members
        .iter()
        .filter_map(|m| {
            let beat = gens.beats.get(&m.member_id)?;
            let since = now.saturating_duration_since(beat.at);
            Some(MemberBeat {
                member_id: m.member_id.clone(),
                since_ms: i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
            })
        })
        .collect()
}

fn status(e: GenerationError) -> Status {
    Status::new(e.code(), e.to_string())
}

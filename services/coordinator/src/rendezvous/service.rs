//! [`RendezvousService`]'s state: every run in memory, fixed and elastic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drove_proto::v1::{JoinRequest, Peer};
use tokio::sync::watch;
use tonic::Status;

use super::elastic_run::ElasticRun;
use super::keys::Keys;
use crate::run_state::RunState;
use crate::store::{Store, StoreError};
use crate::validate::{check_rank, internal, rank_in};

/// Every run in memory: fixed-world runs by rank, elastic runs by generation.
/// A run id is in at most one of the two.
#[derive(Default)]
pub(super) struct Runs {
    pub(super) fixed: HashMap<String, Run>,
    pub(super) elastic: HashMap<String, ElasticRun>,
}

impl Runs {
    /// The keys of run `run_id`, fixed or elastic.
    pub(super) fn keys(&mut self, run_id: &str) -> Option<&mut Keys> {
        if let Some(run) = self.fixed.get_mut(run_id) {
            return Some(&mut run.keys);
        }
        self.elastic.get_mut(run_id).map(|run| &mut run.keys)
    }
}

#[derive(Clone, Debug)]
pub(super) struct MemberAddress {
    pub(super) address: String,
    pub(super) host: String,
}

pub(super) struct Run {
    pub(super) world_size: usize,
    pub(super) members: Vec<Option<MemberAddress>>,
    /// Bumped on every membership change; waiters re-check on change.
    pub(super) changed: watch::Sender<u64>,
    /// Where the run is; changed only through its transitions.
    pub(super) state: RunState,
    /// Which ranks have left.
    pub(super) left: Vec<bool>,
    /// Whether any worker left with an error or fell silent: once every
    /// worker has left, the run ends failed.
    pub(super) failed: bool,
    pub(super) keys: Keys,
    /// Each rank's last heartbeat (none before its first, nor after a restart
    /// until it sends one again: only ranks that send heartbeats can hang).
    pub(super) heartbeats: Vec<Option<Instant>>,
    /// Why the run failed, when the coordinator found out itself.
    pub(super) error: String,
}

impl Run {
    pub(super) fn new(world_size: usize) -> Run {
        Run {
            world_size,
            members: vec![None; world_size],
            changed: watch::channel(0).0,
            state: RunState::default(),
            left: vec![false; world_size],
            failed: false,
            keys: Keys::default(),
            heartbeats: vec![None; world_size],
            error: String::new(),
        }
    }

    pub(super) fn joined(&self) -> usize {
        self.members.iter().filter(|m| m.is_some()).count()
    }

    pub(super) fn peers(&self) -> Option<Vec<Peer>> {
        let members: Vec<&MemberAddress> = self.members.iter().map(Option::as_ref).collect::<Option<_>>()?;
        let mut per_host: HashMap<&str, i32> = HashMap::new();
        Some(
            members
                .iter()
                .enumerate()
                .map(|(rank, m)| {
                    let local = per_host.entry(m.host.as_str()).or_insert(0);
                    let p = Peer {
                        rank: rank as i32,
                        address: m.address.clone(),
                        host: m.host.clone(),
                        local_rank: *local,
                        member_id: String::new(),
                    };
                    *local += 1;
                    p
                })
                .collect(),
        )
    }

    /// The rank a join takes in this run: the one it asks for if that is free,
    /// else the first free one. Refused if the join's world size disagrees with
    /// the run's, the run is full, or the rank asked for is taken.
    pub(super) fn rank_for(&self, req: &JoinRequest) -> Result<usize, Status> {
        let world = req.world_size as usize;
        if self.world_size != world {
            return Err(Status::invalid_argument(format!(
                "world_size {world} disagrees with run {:?}, which expects {} workers",
                req.run_id, self.world_size
            )));
        }
        if self.joined() == world {
            return Err(Status::failed_precondition(format!(
                "run {:?} is full: {world} of {world} workers already joined",
                req.run_id
            )));
        }
        if req.requested_rank < 0 {
            return Ok(self
                .members
                .iter()
                .position(Option::is_none)
                .expect("a free rank in a run that is not full"));
        }
        let r = check_rank(req.requested_rank, world, "requested_rank")?;
        if self.members[r].is_some() {
            return Err(Status::already_exists(format!("run {:?}: rank {r} is already taken", req.run_id)));
        }
        Ok(r)
    }
}

/// Shared rendezvous state.
#[derive(Clone)]
pub struct RendezvousService {
    pub(super) runs: Arc<Mutex<Runs>>,
    pub(super) store: Store,
    pub(super) default_timeout: Duration,
}

impl RendezvousService {
    /// A service persisting runs and their workers in `store`, resuming the
    /// runs that had not ended when the store was last used (a restarted
    /// coordinator); joins wait `default_timeout` unless the request says
    /// otherwise.
    pub fn new(store: Store, default_timeout: Duration) -> Result<Self, StoreError> {
        let mut runs = Runs::default();
        for live in store.live_runs()? {
            if let Some((min, max, generations)) = store.generations(&live.run_id)? {
                let run = ElasticRun::resume(&live.run_id, min, max, generations);
                tracing::info!(run = %live.run_id, generation = run.gens.newest(), "resumed an elastic run from the store");
                runs.elastic.insert(live.run_id, run);
                continue;
            }
            let world = live.world_size.max(0) as usize;
            let mut run = Run::new(world);
            for (r, m) in live.members.iter().filter_map(|m| Some((rank_in(m.rank, world)?, m))) {
                run.members[r] = Some(MemberAddress { address: m.address.clone(), host: m.host.clone() });
                run.left[r] = m.left;
                run.failed |= !m.error.is_empty();
            }
            run.state = live.state.on_resume();
            tracing::info!(run = %live.run_id, state = %run.state, world, joined = run.joined(), "resumed a run from the store");
            runs.fixed.insert(live.run_id, run);
        }
        Ok(RendezvousService { runs: Arc::new(Mutex::new(runs)), store, default_timeout })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Runs> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn persist(
        &self,
        run_id: &str,
        state: RunState,
        world: usize,
        joined: usize,
    ) -> Result<(), Status> {
        self.store.upsert_run(run_id, state, world as i32, joined as i32).map_err(internal)
    }
}

//! [`ElasticComm`]: the membership client, the [`Elastic`] communicator of a
//! run whose worlds form through a drove coordinator.

use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use drove_collective::transport::{Call, Delegate};
use drove_collective::{Collective, Element, ReduceOp, ReduceOptions};
use drove_comm::{CommOptions, Communicator, Liveness};

use crate::heartbeat::{Beat, Beating, spawn_heartbeats};
use crate::rendezvous::{CoordinatorRendezvous, ElasticJoin};
use drove_collective::CommError;
use drove_collective::Place;
use drove_collective::{Elastic, MemberId, ReformCause, World, WorldRange};

/// How long a forming world waits for more members, after its minimum, by
/// default: long enough for a replaced member to come back, short enough
/// that a lost one costs a few seconds.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(2);

/// A member whose heartbeats have not reached the coordinator for this many
/// of its beats is silent: lost at an op's deadline. One still beating is
/// slow, not lost, and is waited for up to the hang limit.
pub const SILENT_AFTER_BEATS: u32 = 5;

/// One world's members as their heartbeats show them: the coordinator's
/// last word on when each beat, aged by the time since it came.
#[derive(Debug)]
struct Heartbeats {
    beat: Arc<Beat>,
    generation: u64,
    /// Member ids by rank.
    members: Vec<String>,
    silent_after: Duration,
}

impl Liveness for Heartbeats {
    fn silent(&self, ranks: &[usize]) -> Vec<usize> {
        let peers = self.beat.peers.lock().unwrap_or_else(|e| e.into_inner());
        let heard = peers.as_ref().filter(|p| p.generation == self.generation);
        let alive = |rank: usize| -> bool {
            let (Some(heard), Some(member)) = (heard, self.members.get(rank)) else { return false };
            heard.since.get(member).is_some_and(|since| *since + heard.heard.elapsed() < self.silent_after)
        };
        ranks.iter().copied().filter(|&r| !alive(r)).collect()
    }
}

/// A communicator whose world can end and re-form: the current world's
/// [`Communicator`], replaced by the next generation's on [`Elastic::reform`].
/// Each world's connections greet with its generation, so a member left out
/// of a newer world cannot reach it.
pub struct ElasticComm {
    rendezvous: CoordinatorRendezvous,
    member: MemberId,
    range: WorldRange,
    settle: Duration,
    rendezvous_timeout: Duration,
    opts: CommOptions,
    /// The current world's communicator; `None` between worlds.
    current: RwLock<Option<Communicator>>,
    world: Mutex<World>,
    beat: Arc<Beat>,
}

impl std::fmt::Debug for ElasticComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElasticComm")
            .field("member", &self.member)
            .field("range", &self.range)
            .field("world", &*self.lock_world())
            .finish()
    }
}

/// Where an elastic member stands in its run.
#[derive(Clone, Debug)]
pub struct Membership {
    /// Its stable id.
    pub member: MemberId,
    /// The sizes its worlds may have.
    pub range: WorldRange,
    /// How long a forming world waits for more members after its minimum.
    pub settle: Duration,
    /// How long a member waits for its next world to form (below MIN that
    /// long, the join fails naming the lost members).
    pub rendezvous_timeout: Duration,
}

/// How long a member waits for a world by default (the coordinator's own
/// join timeout).
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(600);

impl ElasticComm {
    /// Joins the elastic run of `rendezvous` (its coordinator, run id and
    /// bind address; its rank request is not used: ranks are handed out per
    /// generation) as `membership.member`, and connects to the first world it
    /// is given. Waits up to `opts.connect_timeout`.
    pub fn join(
        rendezvous: CoordinatorRendezvous,
        membership: Membership,
        opts: CommOptions,
    ) -> Result<ElasticComm, CommError> {
        let heartbeat = rendezvous.heartbeat;
        let comm = ElasticComm {
            rendezvous,
            member: membership.member,
            range: membership.range,
            settle: membership.settle,
            rendezvous_timeout: membership.rendezvous_timeout,
            opts,
            current: RwLock::new(None),
            world: Mutex::new(World { generation: 0, place: Place::SINGLE, members: Vec::new() }),
            beat: Arc::new(Beat::default()),
        };
        comm.form(0, 0, None)?;
        if let Some(every) = heartbeat {
            let rv = &comm.rendezvous;
            let who = Beating::Member(comm.member.as_str().to_string(), Arc::clone(&comm.beat));
            spawn_heartbeats(rv.connection(), rv.run_id.clone(), who, every);
        }
        Ok(comm)
    }

    /// This member's id.
    pub fn member(&self) -> &MemberId {
        &self.member
    }

    fn lock_world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the generation after `after` and connects to its peers.
    fn form(&self, after: u64, step: u64, cause: Option<&ReformCause>) -> Result<World, CommError> {
        let bind = self.rendezvous.bind;
        let listener = TcpListener::bind(bind).map_err(|e| CommError::io(format!("binding {bind}"), e))?;
        let local = listener.local_addr().map_err(|e| CommError::io("reading the listener's address", e))?;
        let join =
            ElasticJoin { member: &self.member, range: self.range, settle: self.settle, after, step, cause };
        let joined = Instant::now() + self.rendezvous_timeout;
        let (table, world) = self.rendezvous.join_elastic(&join, local, joined)?;
        let deadline = Instant::now() + self.opts.connect_timeout;
        let mut opts = self.opts.clone();
        if let Some(every) = self.rendezvous.heartbeat {
            opts.liveness = Some(Arc::new(Heartbeats {
                beat: Arc::clone(&self.beat),
                generation: world.generation,
                members: world.members.clone(),
                silent_after: every * SILENT_AFTER_BEATS,
            }));
        }
        let comm = Communicator::with_table(listener, &table, world.generation, &opts, deadline)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Some(comm);
        self.beat.generation.store(world.generation, Ordering::SeqCst);
        self.beat.reform.store(false, Ordering::SeqCst);
        *self.lock_world() = world.clone();
        tracing::info!(
            generation = world.generation,
            rank = world.place.rank().get(),
            world = world.place.world().get(),
            member = %self.member,
            "joined a world of the elastic run"
        );
        Ok(world)
    }

    /// Runs `f` on the current world's communicator.
    fn with<R>(&self, f: impl FnOnce(&Communicator) -> Result<R, CommError>) -> Result<R, CommError> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        match current.as_ref() {
            Some(comm) => f(comm),
            None => Err(CommError::Broken {
                cause: "between worlds: the last world ended and no new one has formed".into(),
            }),
        }
    }
}

impl Elastic for ElasticComm {
    fn world(&self) -> World {
        self.lock_world().clone()
    }

    fn range(&self) -> WorldRange {
        self.range
    }

    fn reform_wanted(&self) -> Result<bool, CommError> {
        let mut flag = [i32::from(self.beat.reform.load(Ordering::SeqCst))];
        self.all_reduce(
            "elastic.reform",
            &[1],
            i32::tensor_mut(&mut flag),
            ReduceOptions::new(ReduceOp::Max),
        )?;
        Ok(flag[0] != 0)
    }

    fn reform(&self, step: u64, cause: &ReformCause) -> Result<World, CommError> {
        let after = self.lock_world().generation;
        tracing::warn!(generation = after, step, "the world ends: {cause}; re-forming");
        // Closing this world's connections first tells every peer still in
        // an op with it at once.
        let old = self.current.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(old);
        self.form(after, step, Some(cause))
    }

    fn leave(&self, step: u64, error: Option<&str>) -> Result<(), CommError> {
        self.rendezvous.leave_elastic(&self.member, step, error)
    }
}

/// Every op runs on the current world's communicator (written once, by
/// drove-collective's blanket impl of `Collective` for a `Delegate`).
impl Delegate for ElasticComm {
    fn place(&self) -> Place {
        self.lock_world().place
    }

    fn delegate<R>(
        &self,
        _call: Call<'_>,
        run: impl FnOnce(&dyn Collective) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        self.with(|c| run(c))
    }
}

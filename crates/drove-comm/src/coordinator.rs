//! Rendezvous through a drove coordinator, for launchers such as `drove run`
//! that set `DROVE_COORDINATOR` and `DROVE_RUN_ID` (metric points go through
//! the `drove-metrics` crate: the data plane keeps the rendezvous only).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drove_proto::client::Clients;
use drove_proto::v1::{
    EndKind, GenerationEnd, HeartbeatRequest, HeartbeatResponse, JoinRequest, LeaveRequest,
};

use crate::elastic::{Loss, MemberId, ReformCause, World, WorldRange};
use crate::error::CommError;
use crate::place::{Rank, WorldSize};
use crate::rendezvous::{PeerTable, RankRequest, Rendezvous};

fn rendezvous_err(what: impl std::fmt::Display) -> CommError {
    CommError::Rendezvous(what.to_string())
}

/// Joins a run on a coordinator; the coordinator hands out ranks (or honours the
/// launcher's) and the peer table.
pub struct CoordinatorRendezvous {
    pub(crate) addr: String,
    pub(crate) token: Option<String>,
    pub(crate) run_id: String,
    request: RankRequest,
    pub(crate) bind: SocketAddr,
    host: String,
    runtime: tokio::runtime::Runtime,
    /// How often this rank tells the coordinator it is alive once joined
    /// (`None`: never).
    pub(crate) heartbeat: Option<Duration>,
    /// The launcher's restart count (`DROVE_RESTART_COUNT`), told at join.
    restart_count: u32,
    /// Whether a join waits (until its deadline) for a coordinator that is
    /// not up yet: one that rank 0 serves, as torch's TCPStore clients wait.
    wait_for_coordinator: bool,
}

impl std::fmt::Debug for CoordinatorRendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorRendezvous")
            .field("addr", &self.addr)
            .field("run_id", &self.run_id)
            .field("request", &self.request)
            .finish()
    }
}

/// The local IP that routes to `coordinator` (no packet is sent).
fn local_ip_towards(coordinator: &str) -> Option<IpAddr> {
    let target = coordinator.rsplit("://").next()?.to_socket_addrs().ok()?.next()?;
    if target.ip().is_loopback() {
        return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let socket = UdpSocket::bind(if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).ok()?;
    socket.connect(target).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

impl CoordinatorRendezvous {
    /// Joins `run_id` on the coordinator at `addr`, in the world and at the
    /// rank (or any free rank) of `request`.
    pub fn new(
        addr: &str,
        run_id: &str,
        request: RankRequest,
        token: Option<&str>,
    ) -> Result<Self, CommError> {
        let ip = local_ip_towards(addr).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CommError::io("starting the coordinator client", e))?;
        Ok(CoordinatorRendezvous {
            addr: addr.to_string(),
            token: token.map(str::to_string),
            run_id: run_id.to_string(),
            request,
            bind: SocketAddr::new(ip, 0),
            host: host_name(),
            runtime,
            heartbeat: Some(DEFAULT_HEARTBEAT),
            restart_count: 0,
            wait_for_coordinator: false,
        })
    }

    /// From `DROVE_COORDINATOR`, `DROVE_RUN_ID`, `DROVE_WORLD_SIZE`, and the
    /// optional `DROVE_RANK` (or a Kubernetes Indexed Job's
    /// `JOB_COMPLETION_INDEX`; see [`launch_vars`](crate::launch_vars)),
    /// `DROVE_TOKEN`, `DROVE_BIND` (the data-plane listen address; by default
    /// the address that routes to the coordinator) and `DROVE_HEARTBEAT_SECS`
    /// (how often the joined rank says it is alive; 0: never; default 2).
    pub fn from_env() -> Result<Self, CommError> {
        let var = |name: &str| std::env::var(name).map_err(|_| rendezvous_err(format!("{name} is not set")));
        let addr = var("DROVE_COORDINATOR")?;
        let run_id = var("DROVE_RUN_ID")?;
        Self::from_env_with(&addr, &run_id, crate::rendezvous::launch_env()?)
    }

    /// [`from_env`](Self::from_env) with the coordinator, run and place
    /// given (an elastic member's come from each generation), the rest
    /// (`DROVE_TOKEN`, `DROVE_BIND`, `DROVE_HEARTBEAT_SECS`,
    /// `DROVE_RESTART_COUNT`) from the environment.
    pub fn from_env_with(addr: &str, run_id: &str, request: RankRequest) -> Result<Self, CommError> {
        let token = std::env::var("DROVE_TOKEN").ok().filter(|t| !t.is_empty());
        let mut rv = Self::new(addr, run_id, request, token.as_deref())?;
        if let Ok(v) = std::env::var("DROVE_HEARTBEAT_SECS") {
            let secs: f64 = v.trim().parse().map_err(|_| {
                rendezvous_err(format!("DROVE_HEARTBEAT_SECS={v:?} is not a number of seconds"))
            })?;
            rv.heartbeat = match secs {
                0.0 => None,
                s if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
                _ => {
                    return Err(rendezvous_err(format!(
                        "DROVE_HEARTBEAT_SECS={v:?} must be a finite number of seconds of at least 0 (0: no heartbeats)"
                    )));
                }
            };
        }
        if let Ok(v) = std::env::var("DROVE_RESTART_COUNT") {
            rv.restart_count = v
                .trim()
                .parse()
                .map_err(|_| rendezvous_err(format!("DROVE_RESTART_COUNT={v:?} is not a whole number")))?;
        }
        if let Ok(bind) = std::env::var("DROVE_BIND") {
            rv.bind =
                bind.parse().map_err(|_| rendezvous_err(format!("DROVE_BIND={bind:?} is not an address")))?;
        }
        Ok(rv)
    }

    /// Whether a join waits, until its deadline, for a coordinator that is
    /// not up yet (one that rank 0 serves: the other ranks may start first).
    pub fn waiting_for_coordinator(mut self, wait: bool) -> Self {
        self.wait_for_coordinator = wait;
        self
    }

    /// Tells the coordinator this rank is done (with an error message if it failed).
    pub fn leave(&self, rank: Rank, error: Option<&str>) -> Result<(), CommError> {
        self.runtime.block_on(async {
            let mut c = Clients::connect(&self.addr, self.token.as_deref()).await.map_err(rendezvous_err)?;
            c.rendezvous
                .leave(LeaveRequest {
                    run_id: self.run_id.clone(),
                    rank: wire_rank(rank),
                    error: error.unwrap_or_default().to_string(),
                    ..Default::default()
                })
                .await
                .map_err(|s| rendezvous_err(s.message()))?;
            Ok(())
        })
    }
}

impl CoordinatorRendezvous {
    /// One join, answered or refused; while the coordinator cannot be
    /// reached or is restarting and `retry` holds, tried again (after 50 ms,
    /// doubling to at most 1 s) until `deadline`. Each try asks the
    /// coordinator to wait only for what is left of the deadline.
    fn join_until(
        &self,
        mut request: JoinRequest,
        deadline: Instant,
        retry: bool,
    ) -> Result<drove_proto::v1::JoinResponse, tonic::Status> {
        let mut backoff = Duration::from_millis(50);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            request.timeout_ms = left.as_millis().max(1) as i64;
            let answer = self.runtime.block_on(async {
                let mut c = Clients::connect(&self.addr, self.token.as_deref())
                    .await
                    .map_err(|e| tonic::Status::unavailable(format!("cannot reach the coordinator: {e}")))?;
                c.rendezvous.join(request.clone()).await.map(tonic::Response::into_inner)
            });
            let status = match answer {
                Ok(response) => return Ok(response),
                Err(status) => status,
            };
            let away = matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
            );
            if !(retry && away && !left.is_zero()) {
                return Err(status);
            }
            tracing::debug!(
                "joining run {:?} at {}: {} (retrying)",
                self.run_id,
                self.addr,
                status.message()
            );
            std::thread::sleep(backoff.min(left));
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    /// The address peers reach `listening` at (the address that routes to
    /// the coordinator when it listens on every interface).
    fn advertised(&self, listening: SocketAddr) -> SocketAddr {
        if listening.ip().is_unspecified() {
            SocketAddr::new(
                local_ip_towards(&self.addr).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                listening.port(),
            )
        } else {
            listening
        }
    }

    /// Joins the elastic run's next generation after `join.after` (0: a new
    /// member), waiting until `deadline`; retries while the coordinator is
    /// away (a restart in the middle of a re-form), so the join completes
    /// once it is back. A world formed without this member is
    /// [`CommError::LeftOut`].
    pub(crate) fn join_elastic(
        &self,
        join: &ElasticJoin<'_>,
        listening: SocketAddr,
        deadline: Instant,
    ) -> Result<(PeerTable, World), CommError> {
        let request = JoinRequest {
            run_id: self.run_id.clone(),
            address: self.advertised(listening).to_string(),
            host: self.host.clone(),
            requested_rank: -1,
            restart_count: i32::try_from(self.restart_count).unwrap_or(i32::MAX),
            member_id: join.member.as_str().to_string(),
            min_size: wire_size(join.range.min().get()),
            max_size: wire_size(join.range.max().get()),
            after_generation: join.after as i64,
            settle_ms: join.settle.as_millis() as i64,
            step: join.step as i64,
            cause: join.cause.map(cause_to_wire),
            ..Default::default()
        };
        // Retried while the coordinator is away (a restart in the middle of a re-form).
        match self.join_until(request, deadline, true) {
            Ok(response) => self.elastic_world(response),
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                Err(CommError::LeftOut(status.message().to_string()))
            }
            Err(status) => Err(rendezvous_err(format!(
                "joining run {:?} at {} as member {}: {}",
                self.run_id,
                self.addr,
                join.member,
                status.message()
            ))),
        }
    }

    fn elastic_world(&self, resp: drove_proto::v1::JoinResponse) -> Result<(PeerTable, World), CommError> {
        let addrs = peer_addrs(&resp.peers)?;
        let rank = usize::try_from(resp.rank).unwrap_or(usize::MAX);
        let given = addrs.len();
        let table = PeerTable::new(Rank::new(rank), addrs).map_err(|_| {
            rendezvous_err(format!("the rendezvous gave rank {} and {given} addresses", resp.rank))
        })?;
        let generation = u64::try_from(resp.generation).unwrap_or(0);
        if generation == 0 {
            return Err(rendezvous_err(format!(
                "the coordinator at {} answered an elastic join without a generation (an older coordinator?)",
                self.addr
            )));
        }
        let members = resp.peers.iter().map(|p| p.member_id.clone()).collect();
        let world = World { generation, place: table.place(), members };
        Ok((table, world))
    }

    /// Tells the coordinator the elastic member `member` is done at `step`.
    pub(crate) fn leave_elastic(
        &self,
        member: &MemberId,
        step: u64,
        error: Option<&str>,
    ) -> Result<(), CommError> {
        self.runtime.block_on(async {
            let mut c = Clients::connect(&self.addr, self.token.as_deref()).await.map_err(rendezvous_err)?;
            c.rendezvous
                .leave(LeaveRequest {
                    run_id: self.run_id.clone(),
                    member_id: member.as_str().to_string(),
                    step: step as i64,
                    error: error.unwrap_or_default().to_string(),
                    ..Default::default()
                })
                .await
                .map_err(|s| rendezvous_err(s.message()))?;
            Ok(())
        })
    }
}

/// Every peer's data-plane address, in rank order; an error naming the first
/// that is not an address.
fn peer_addrs(peers: &[drove_proto::v1::Peer]) -> Result<Vec<SocketAddr>, CommError> {
    peers
        .iter()
        .map(|p| {
            p.address.parse().map_err(|_| {
                rendezvous_err(format!("rank {} has an unusable address {:?}", p.rank, p.address))
            })
        })
        .collect()
}

/// What an elastic member tells the coordinator when it joins a generation.
pub(crate) struct ElasticJoin<'a> {
    pub member: &'a MemberId,
    pub range: WorldRange,
    pub settle: Duration,
    /// The generation it was last in (0: none).
    pub after: u64,
    /// Its last applied step.
    pub step: u64,
    /// Why it re-forms.
    pub cause: Option<&'a ReformCause>,
}

fn wire_size(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A rank as the protocol's `int32` (world sizes past `i32::MAX` cannot join).
fn wire_rank(rank: Rank) -> i32 {
    i32::try_from(rank.get()).unwrap_or(i32::MAX)
}

/// How often a joined rank sends a heartbeat by default.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);

/// Who sends heartbeats: a rank of a fixed world, or a member of an elastic
/// run (whose generation changes, and who hears that its world should re-form).
pub(crate) enum Beating {
    /// A rank of a fixed world.
    Rank(Rank),
    /// A member of an elastic run.
    Member(String, Arc<Beat>),
}

/// What an elastic member's heartbeats carry and hear.
#[derive(Debug, Default)]
pub(crate) struct Beat {
    /// The generation the member runs in.
    pub generation: AtomicU64,
    /// The coordinator said a newer generation is forming.
    pub reform: AtomicBool,
    /// Why, as it said.
    pub cause: Mutex<Option<ReformCause>>,
    /// When the other members of its generation last beat, as last heard.
    pub peers: Mutex<Option<PeerBeats>>,
}

/// The coordinator's last word on when each member of a generation beat.
#[derive(Debug)]
pub(crate) struct PeerBeats {
    /// The generation it is about.
    pub generation: u64,
    /// When the answer came.
    pub heard: Instant,
    /// Member id -> time since its last beat, at `heard`.
    pub since: HashMap<String, Duration>,
}

impl Beating {
    fn request(&self, run_id: &str) -> HeartbeatRequest {
        match self {
            Beating::Rank(rank) => {
                HeartbeatRequest { run_id: run_id.to_string(), rank: wire_rank(*rank), ..Default::default() }
            }
            Beating::Member(id, beat) => HeartbeatRequest {
                run_id: run_id.to_string(),
                member_id: id.clone(),
                generation: beat.generation.load(Ordering::SeqCst) as i64,
                ..Default::default()
            },
        }
    }

    /// Takes in the answer to a heartbeat sent for `generation`.
    fn heard(&self, response: &HeartbeatResponse, generation: u64) {
        if let Beating::Member(_, beat) = self {
            let since = response
                .member_beats
                .iter()
                .map(|b| (b.member_id.clone(), Duration::from_millis(u64::try_from(b.since_ms).unwrap_or(0))))
                .collect();
            *beat.peers.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(PeerBeats { generation, heard: Instant::now(), since });
        }
        if let Beating::Member(_, beat) = self
            && response.reform
            && response.generation as u64 > beat.generation.load(Ordering::SeqCst)
        {
            let cause = response.reform_cause.as_ref().map(cause_from_wire);
            *beat.cause.lock().unwrap_or_else(|e| e.into_inner()) = cause;
            beat.reform.store(true, Ordering::SeqCst);
        }
    }
}

/// A cause as the wire carries it.
pub(crate) fn cause_to_wire(cause: &ReformCause) -> GenerationEnd {
    let kind = match cause.kind {
        Loss::ClosedConnection => EndKind::ClosedConnection,
        Loss::Deadline => EndKind::CollectiveDeadline,
        Loss::Heartbeat => EndKind::Heartbeat,
        Loss::MemberAdded => EndKind::MemberAdded,
    };
    GenerationEnd { kind: kind.into(), members: cause.members.clone(), detail: cause.detail.clone() }
}

fn cause_from_wire(end: &GenerationEnd) -> ReformCause {
    let kind = match EndKind::try_from(end.kind).unwrap_or(EndKind::Unspecified) {
        EndKind::CollectiveDeadline => Loss::Deadline,
        EndKind::Heartbeat => Loss::Heartbeat,
        EndKind::MemberAdded => Loss::MemberAdded,
        _ => Loss::ClosedConnection,
    };
    ReformCause { kind, members: end.members.clone(), detail: end.detail.clone() }
}

/// Sends a heartbeat for `who` every `every` for as long as the process
/// lives (a stopped or hung process stops sending, which is the point); a
/// coordinator that is away is tried again at the next beat.
pub(crate) fn spawn_heartbeats(
    addr: String,
    token: Option<String>,
    run_id: String,
    who: Beating,
    every: Duration,
) {
    let beat = move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        runtime.block_on(async {
            let mut clients: Option<Clients> = None;
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let call = async {
                    if clients.is_none() {
                        clients =
                            Some(Clients::connect(&addr, token.as_deref()).await.map_err(|e| e.to_string())?);
                    }
                    let c = clients.as_mut().expect("connected above");
                    let request = who.request(&run_id);
                    let generation = u64::try_from(request.generation).unwrap_or(0);
                    let response =
                        c.rendezvous.heartbeat(request).await.map_err(|s| s.message().to_string())?;
                    Ok::<_, String>((response, generation))
                };
                match tokio::time::timeout(every.max(Duration::from_secs(1)) * 2, call).await {
                    Ok(Ok((response, generation))) => who.heard(response.get_ref(), generation),
                    Ok(Err(e)) => {
                        tracing::debug!("heartbeat to {addr} failed: {e}");
                        clients = None;
                    }
                    Err(_) => clients = None,
                }
            }
        });
    };
    if let Err(e) = std::thread::Builder::new().name("drove-heartbeat".into()).spawn(beat) {
        tracing::warn!("cannot start the heartbeat thread ({e}): this rank cannot be watched for hangs");
    }
}

impl Rendezvous for CoordinatorRendezvous {
    fn world_size(&self) -> WorldSize {
        self.request.world()
    }

    fn bind_addr(&self) -> SocketAddr {
        self.bind
    }

    fn exchange(&self, listening: SocketAddr, deadline: Instant) -> Result<PeerTable, CommError> {
        let advertised = self.advertised(listening);
        let request = JoinRequest {
            run_id: self.run_id.clone(),
            world_size: i32::try_from(self.request.world().get()).unwrap_or(i32::MAX),
            address: advertised.to_string(),
            host: self.host.clone(),
            requested_rank: self.request.rank().map_or(-1, wire_rank),
            restart_count: i32::try_from(self.restart_count).unwrap_or(i32::MAX),
            ..Default::default()
        };
        let resp = self.join_until(request, deadline, self.wait_for_coordinator).map_err(|s| {
            rendezvous_err(format!("joining run {:?} at {}: {}", self.run_id, self.addr, s.message()))
        })?;
        let addrs = peer_addrs(&resp.peers)?;
        let (rank, given) = (usize::try_from(resp.rank).unwrap_or(usize::MAX), addrs.len());
        let table = PeerTable::new(Rank::new(rank), addrs).map_err(|_| {
            rendezvous_err(format!(
                "the rendezvous gave rank {} and {given} addresses for world size {}",
                resp.rank,
                self.request.world()
            ))
        })?;
        if let Some(every) = self.heartbeat {
            let rank = table.place().rank();
            spawn_heartbeats(
                self.addr.clone(),
                self.token.clone(),
                self.run_id.clone(),
                Beating::Rank(rank),
                every,
            );
        }
        Ok(table)
    }
}

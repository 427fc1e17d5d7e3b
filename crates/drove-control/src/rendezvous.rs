//! [`CoordinatorRendezvous`]: ranks find each other through a drove
//! coordinator, which hands out ranks (or honours the launcher's) and the
//! peer table; for an elastic run, each generation's world.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use crate::connect::Connection;
use drove_collective::{CommError, MemberId, Rank, ReformCause, World, WorldRange, WorldSize};
use drove_comm::{PeerTable, RankRequest, Rendezvous};
use drove_proto::v1::{JoinRequest, LeaveRequest};

use crate::heartbeat::{Beating, DEFAULT_HEARTBEAT, spawn_heartbeats};
use crate::runtime::block_on;
use crate::wire::{cause_to_wire, wire_rank, wire_size};

fn rendezvous_err(what: impl std::fmt::Display) -> CommError {
    CommError::Rendezvous(what.to_string())
}

/// Joins a run on a coordinator; the coordinator hands out ranks (or honours the
/// launcher's) and the peer table.
pub struct CoordinatorRendezvous {
    pub(crate) addr: String,
    pub(crate) token: Option<String>,
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    pub(crate) run_id: String,
    request: RankRequest,
    pub(crate) bind: SocketAddr,
    host: String,
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
        Ok(CoordinatorRendezvous {
            addr: addr.to_string(),
            token: token.map(str::to_string),
            tls_ca: None,
            run_id: run_id.to_string(),
            request,
            bind: SocketAddr::new(ip, 0),
            host: host_name(),
            heartbeat: Some(DEFAULT_HEARTBEAT),
            restart_count: 0,
            wait_for_coordinator: false,
        })
    }

    /// Trusts the certificate authority in the PEM file `ca` (if any) for an
    /// `https://` coordinator.
    pub fn with_tls_ca(mut self, ca: Option<std::path::PathBuf>) -> Self {
        self.tls_ca = ca;
        self
    }

    /// How the coordinator is reached: address, token and CA file.
    pub fn connection(&self) -> Connection {
        Connection { addr: self.addr.clone(), token: self.token.clone(), tls_ca: self.tls_ca.clone() }
    }

    /// How often the joined rank tells the coordinator it is alive (`None`:
    /// never; by default every 2 s).
    pub fn heartbeat(mut self, every: Option<Duration>) -> Self {
        self.heartbeat = every;
        self
    }

    /// How often it does (see [`CoordinatorRendezvous::heartbeat`]).
    pub fn heartbeat_every(&self) -> Option<Duration> {
        self.heartbeat
    }

    /// The launcher's restart count, told at the join.
    pub fn restart_count(mut self, restarts: u32) -> Self {
        self.restart_count = restarts;
        self
    }

    /// The data plane's listen address (by default the address that routes
    /// to the coordinator, any port).
    pub fn bind(mut self, bind: SocketAddr) -> Self {
        self.bind = bind;
        self
    }

    /// Whether a join waits, until its deadline, for a coordinator that is
    /// not up yet (one that rank 0 serves: the other ranks may start first).
    pub fn waiting_for_coordinator(mut self, wait: bool) -> Self {
        self.wait_for_coordinator = wait;
        self
    }

    /// Tells the coordinator this rank is done (with an error message if it failed).
    pub fn leave(&self, rank: Rank, error: Option<&str>) -> Result<(), CommError> {
        self.send_leave(LeaveRequest {
            run_id: self.run_id.clone(),
            rank: wire_rank(rank),
            error: error.unwrap_or_default().to_string(),
            ..Default::default()
        })
    }

    /// Sends one leave to the coordinator.
    fn send_leave(&self, request: LeaveRequest) -> Result<(), CommError> {
        block_on(async {
            let mut c = self.connection().connect().await.map_err(rendezvous_err)?;
            c.rendezvous.leave(request).await.map_err(|s| rendezvous_err(s.message()))?;
            Ok(())
        })
        .map_err(|e| CommError::io("leaving the run", e))?
    }
}

impl CoordinatorRendezvous {
    /// One join, answered or refused; while the coordinator cannot be
    /// reached or is restarting and `retry` holds, tried again (after 50 ms,
    /// doubling to at most 1 s) until `deadline`. Each try asks the
    /// coordinator to wait only for what is left of the deadline. Given up
    /// at the deadline, the last refusal says how long it was tried.
    fn join_until(
        &self,
        mut request: JoinRequest,
        deadline: Instant,
        retry: bool,
    ) -> Result<drove_proto::v1::JoinResponse, tonic::Status> {
        let allowed = deadline.saturating_duration_since(Instant::now());
        let mut backoff = Duration::from_millis(50);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            request.timeout_ms = left.as_millis().max(1) as i64;
            let answer = block_on(async {
                let mut c =
                    self.connection().connect().await.map_err(|e| {
                        tonic::Status::unavailable(format!("cannot reach the coordinator: {e}"))
                    })?;
                c.rendezvous.join(request.clone()).await.map(tonic::Response::into_inner)
            })
            .unwrap_or_else(|e| Err(tonic::Status::internal(e.to_string())));
            let status = match answer {
                Ok(response) => return Ok(response),
                Err(status) => status,
            };
            let away = matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
            );
            if retry && away && left.is_zero() {
                // Said, so that a user knows the wait was the deadline's and can lengthen it.
                let why = format!(
                    "{} (still so at the deadline, {:.1} s after the first try)",
                    status.message(),
                    allowed.as_secs_f64()
                );
                return Err(tonic::Status::new(status.code(), why));
            }
            if !(retry && away) {
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
        self.send_leave(LeaveRequest {
            run_id: self.run_id.clone(),
            member_id: member.as_str().to_string(),
            step: step as i64,
            error: error.unwrap_or_default().to_string(),
            ..Default::default()
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
            spawn_heartbeats(self.connection(), self.run_id.clone(), Beating::Rank(rank), every);
        }
        Ok(table)
    }
}

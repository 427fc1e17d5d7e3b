//! Rendezvous through a drove coordinator, for launchers such as `drove run`
//! that set `DROVE_COORDINATOR` and `DROVE_RUN_ID` (metric points go through
//! the `drove-metrics` crate: the data plane keeps the rendezvous only).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use drove_proto::client::Clients;
use drove_proto::v1::{HeartbeatRequest, JoinRequest, LeaveRequest};

use crate::error::CommError;
use crate::place::{Rank, WorldSize};
use crate::rendezvous::{PeerTable, RankRequest, Rendezvous};

fn rendezvous_err(what: impl std::fmt::Display) -> CommError {
    CommError::Rendezvous(what.to_string())
}

/// Joins a run on a coordinator; the coordinator hands out ranks (or honours the
/// launcher's) and the peer table.
pub struct CoordinatorRendezvous {
    addr: String,
    token: Option<String>,
    run_id: String,
    request: RankRequest,
    bind: SocketAddr,
    host: String,
    runtime: tokio::runtime::Runtime,
    /// How often this rank tells the coordinator it is alive once joined
    /// (`None`: never).
    heartbeat: Option<Duration>,
    /// The launcher's restart count (`DROVE_RESTART_COUNT`), told at join.
    restart_count: u32,
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
        let request = crate::rendezvous::launch_env()?;
        let token = std::env::var("DROVE_TOKEN").ok();
        let mut rv = Self::new(&addr, &run_id, request, token.as_deref())?;
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

    /// Tells the coordinator this rank is done (with an error message if it failed).
    pub fn leave(&self, rank: Rank, error: Option<&str>) -> Result<(), CommError> {
        self.runtime.block_on(async {
            let mut c = Clients::connect(&self.addr, self.token.as_deref()).await.map_err(rendezvous_err)?;
            c.rendezvous
                .leave(LeaveRequest {
                    run_id: self.run_id.clone(),
                    rank: wire_rank(rank),
                    error: error.unwrap_or_default().to_string(),
                })
                .await
                .map_err(|s| rendezvous_err(s.message()))?;
            Ok(())
        })
    }
}

/// A rank as the protocol's `int32` (world sizes past `i32::MAX` cannot join).
fn wire_rank(rank: Rank) -> i32 {
    i32::try_from(rank.get()).unwrap_or(i32::MAX)
}

/// How often a joined rank sends a heartbeat by default.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);

/// Sends a heartbeat for `rank` every `every` for as long as the process
/// lives (a stopped or hung process stops sending, which is the point); a
/// coordinator that is away is tried again at the next beat.
fn spawn_heartbeats(addr: String, token: Option<String>, run_id: String, rank: Rank, every: Duration) {
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
                    let request =
                        HeartbeatRequest { run_id: run_id.clone(), rank: wire_rank(rank), observer: false };
                    c.rendezvous.heartbeat(request).await.map_err(|s| s.message().to_string())
                };
                match tokio::time::timeout(every.max(Duration::from_secs(1)) * 2, call).await {
                    Ok(Ok(_)) => {}
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
        let advertised = if listening.ip().is_unspecified() {
            SocketAddr::new(
                local_ip_towards(&self.addr).unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                listening.port(),
            )
        } else {
            listening
        };
        let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let table = self.runtime.block_on(async {
            let mut c = Clients::connect(&self.addr, self.token.as_deref()).await.map_err(rendezvous_err)?;
            let resp = c
                .rendezvous
                .join(JoinRequest {
                    run_id: self.run_id.clone(),
                    world_size: i32::try_from(self.request.world().get()).unwrap_or(i32::MAX),
                    address: advertised.to_string(),
                    host: self.host.clone(),
                    requested_rank: self.request.rank().map_or(-1, wire_rank),
                    timeout_ms: timeout.as_millis() as i64,
                    restart_count: i32::try_from(self.restart_count).unwrap_or(i32::MAX),
                })
                .await
                .map_err(|s| {
                    rendezvous_err(format!("joining run {:?} at {}: {}", self.run_id, self.addr, s.message()))
                })?
                .into_inner();
            let addrs = resp
                .peers
                .iter()
                .map(|p| {
                    p.address.parse().map_err(|_| {
                        rendezvous_err(format!("rank {} has an unusable address {:?}", p.rank, p.address))
                    })
                })
                .collect::<Result<Vec<SocketAddr>, _>>()?;
            let (rank, given) = (usize::try_from(resp.rank).unwrap_or(usize::MAX), addrs.len());
            PeerTable::new(Rank::new(rank), addrs).map_err(|_| {
                rendezvous_err(format!(
                    "the rendezvous gave rank {} and {given} addresses for world size {}",
                    resp.rank,
                    self.request.world()
                ))
            })
        })?;
        if let Some(every) = self.heartbeat {
            let rank = table.place().rank();
            spawn_heartbeats(self.addr.clone(), self.token.clone(), self.run_id.clone(), rank, every);
        }
        Ok(table)
    }
}

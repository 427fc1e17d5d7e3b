//! Rendezvous (and metric recording) through a drove coordinator, for launchers
//! such as `drove run` that set `DROVE_COORDINATOR` and `DROVE_RUN_ID`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::time::{Duration, Instant};

use drove_proto::client::Clients;
use drove_proto::v1::{JoinRequest, LeaveRequest, MetricPoint, PushRequest};

use crate::error::CommError;
use crate::rendezvous::{PeerTable, Rendezvous};

fn rendezvous_err(what: impl std::fmt::Display) -> CommError {
    CommError::Rendezvous(what.to_string())
}

/// Joins a run on a coordinator; the coordinator hands out ranks (or honours the
/// launcher's) and the peer table.
pub struct CoordinatorRendezvous {
    addr: String,
    token: Option<String>,
    run_id: String,
    world: usize,
    requested_rank: Option<usize>,
    bind: SocketAddr,
    host: String,
    runtime: tokio::runtime::Runtime,
}

impl std::fmt::Debug for CoordinatorRendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorRendezvous")
            .field("addr", &self.addr)
            .field("run_id", &self.run_id)
            .field("world", &self.world)
            .field("requested_rank", &self.requested_rank)
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
    /// Joins `run_id` (of `world` ranks) on the coordinator at `addr`, as rank
    /// `rank` if given (else any free rank).
    pub fn new(
        addr: &str,
        run_id: &str,
        world: usize,
        rank: Option<usize>,
        token: Option<&str>,
    ) -> Result<Self, CommError> {
        if world == 0 {
            return Err(rendezvous_err("world size must be at least 1, found 0"));
        }
        let ip = local_ip_towards(addr).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CommError::io("starting the coordinator client", e))?;
        Ok(CoordinatorRendezvous {
            addr: addr.to_string(),
            token: token.map(str::to_string),
            run_id: run_id.to_string(),
            world,
            requested_rank: rank,
            bind: SocketAddr::new(ip, 0),
            host: host_name(),
            runtime,
        })
    }

    /// From `DROVE_COORDINATOR`, `DROVE_RUN_ID`, `DROVE_WORLD_SIZE`, and the
    /// optional `DROVE_RANK` (or a Kubernetes Indexed Job's
    /// `JOB_COMPLETION_INDEX`; see [`launch_vars`](crate::launch_vars)),
    /// `DROVE_TOKEN` and `DROVE_BIND` (the data-plane
    /// listen address; by default the address that routes to the coordinator).
    pub fn from_env() -> Result<Self, CommError> {
        let var = |name: &str| std::env::var(name).map_err(|_| rendezvous_err(format!("{name} is not set")));
        let addr = var("DROVE_COORDINATOR")?;
        let run_id = var("DROVE_RUN_ID")?;
        let (world, rank) = crate::rendezvous::launch_env()?;
        let token = std::env::var("DROVE_TOKEN").ok();
        let mut rv = Self::new(&addr, &run_id, world, rank, token.as_deref())?;
        if let Ok(bind) = std::env::var("DROVE_BIND") {
            rv.bind =
                bind.parse().map_err(|_| rendezvous_err(format!("DROVE_BIND={bind:?} is not an address")))?;
        }
        Ok(rv)
    }

    /// Tells the coordinator this rank is done (with an error message if it failed).
    pub fn leave(&self, rank: usize, error: Option<&str>) -> Result<(), CommError> {
        self.runtime.block_on(async {
            let mut c = Clients::connect(&self.addr, self.token.as_deref()).await.map_err(rendezvous_err)?;
            c.rendezvous
                .leave(LeaveRequest {
                    run_id: self.run_id.clone(),
                    rank: rank as i32,
                    error: error.unwrap_or_default().to_string(),
                })
                .await
                .map_err(|s| rendezvous_err(s.message()))?;
            Ok(())
        })
    }
}

impl Rendezvous for CoordinatorRendezvous {
    fn world_size(&self) -> usize {
        self.world
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
        self.runtime.block_on(async {
            let mut c = Clients::connect(&self.addr, self.token.as_deref()).await.map_err(rendezvous_err)?;
            let resp = c
                .rendezvous
                .join(JoinRequest {
                    run_id: self.run_id.clone(),
                    world_size: self.world as i32,
                    address: advertised.to_string(),
                    host: self.host.clone(),
                    requested_rank: self.requested_rank.map_or(-1, |r| r as i32),
                    timeout_ms: timeout.as_millis() as i64,
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
            Ok(PeerTable { rank: resp.rank as usize, addrs })
        })
    }
}

/// Records metric points on a coordinator from synchronous code: points are
/// buffered and pushed in batches by a background thread; `flush` waits until
/// every point recorded so far is acknowledged (stored).
pub struct MetricsRecorder {
    tx: Option<std::sync::mpsc::Sender<Command>>,
    worker: Option<std::thread::JoinHandle<()>>,
    run_id: String,
    rank: i32,
}

enum Command {
    Point(MetricPoint),
    Flush(std::sync::mpsc::Sender<Result<u64, String>>),
}

impl MetricsRecorder {
    /// A recorder for `rank` of `run_id` on the coordinator at `addr`.
    pub fn new(addr: &str, token: Option<&str>, run_id: &str, rank: usize) -> Result<Self, CommError> {
        let (tx, rx) = std::sync::mpsc::channel::<Command>();
        let (addr, token) = (addr.to_string(), token.map(str::to_string));
        let worker = std::thread::Builder::new()
            .name("drove-metrics".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        for cmd in rx {
                            if let Command::Flush(reply) = cmd {
                                let _ = reply.send(Err(format!("cannot start a runtime: {e}")));
                            }
                        }
                        return;
                    }
                };
                push_loop(&runtime, addr, token, rx);
            })
            .map_err(|e| CommError::io("starting the metrics thread", e))?;
        Ok(MetricsRecorder {
            tx: Some(tx),
            worker: Some(worker),
            run_id: run_id.to_string(),
            rank: rank as i32,
        })
    }

    /// Records `name = value` at `step`.
    pub fn record(&self, step: f64, name: &str, value: f64) {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let point = MetricPoint {
            run_id: self.run_id.clone(),
            rank: self.rank,
            step,
            name: name.to_string(),
            value,
            wall_time_unix_ms: wall,
        };
        if let Some(tx) = &self.tx {
            let _ = tx.send(Command::Point(point));
        }
    }

    /// Waits until every point recorded so far is stored; returns how many were.
    pub fn flush(&self) -> Result<u64, CommError> {
        let (reply, answer) = std::sync::mpsc::channel();
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(Command::Flush(reply)).ok())
            .ok_or_else(|| rendezvous_err("the metrics thread stopped"))?;
        answer
            .recv_timeout(PUSH_TIMEOUT * 2)
            .map_err(|_| {
                rendezvous_err(format!(
                    "the coordinator did not acknowledge the metrics within {:?}",
                    PUSH_TIMEOUT * 2
                ))
            })?
            .map_err(rendezvous_err)
    }
}

impl Drop for MetricsRecorder {
    fn drop(&mut self) {
        let flushed = self.flush();
        self.tx.take();
        match flushed {
            Ok(_) => {
                if let Some(w) = self.worker.take() {
                    let _ = w.join();
                }
            }
            // The thread may still be inside a push: leave it, bounded by PUSH_TIMEOUT.
            Err(e) => tracing::warn!("metrics not stored: {e}"),
        }
    }
}

/// How long one batch of metric points may take to be stored.
const PUSH_TIMEOUT: Duration = Duration::from_secs(20);

fn push_loop(
    runtime: &tokio::runtime::Runtime,
    addr: String,
    token: Option<String>,
    rx: std::sync::mpsc::Receiver<Command>,
) {
    let mut stored_total = 0u64;
    let mut error: Option<String> = None;
    let mut pending: Vec<MetricPoint> = Vec::new();
    // Block for the next command, then take everything queued behind it as one batch.
    while let Ok(first) = rx.recv() {
        let mut flushes = Vec::new();
        for cmd in std::iter::once(first).chain(rx.try_iter()) {
            match cmd {
                Command::Point(p) => pending.push(p),
                Command::Flush(reply) => flushes.push(reply),
            }
        }
        if !pending.is_empty() && error.is_none() {
            let batch = std::mem::take(&mut pending);
            let n = batch.len() as u64;
            // Bounded: a coordinator cut off mid-stream must not hold the rank.
            let push = async {
                tokio::time::timeout(PUSH_TIMEOUT, push_batch(&addr, token.as_deref(), batch)).await
            };
            match runtime.block_on(push) {
                Ok(Ok(())) => stored_total += n,
                Ok(Err(e)) => error = Some(e),
                Err(_) => {
                    error = Some(format!("the coordinator did not store a batch within {PUSH_TIMEOUT:?}"))
                }
            }
        }
        for reply in flushes {
            let _ = reply.send(match &error {
                Some(e) => Err(e.clone()),
                None => Ok(stored_total),
            });
        }
    }
}

async fn push_batch(addr: &str, token: Option<&str>, batch: Vec<MetricPoint>) -> Result<(), String> {
    let mut c = Clients::connect(addr, token).await.map_err(|e| e.to_string())?;
    let n = batch.len() as u64;
    let stream = tonic::codegen::tokio_stream::iter(vec![PushRequest { points: batch }]);
    let mut acks = c.metrics.push(stream).await.map_err(|s| s.message().to_string())?.into_inner();
    let mut stored = 0;
    while let Some(ack) = acks.message().await.map_err(|s| s.message().to_string())? {
        stored = ack.stored;
    }
    if stored != n {
        return Err(format!("the coordinator stored {stored} of {n} points"));
    }
    Ok(())
}

//! # drove-coordinator: the control plane of a drove job
//!
//! One gRPC server with three services (see `proto/drove/v1`):
//!
//! - **Rendezvous**: workers join a run id and wait until the world is complete;
//!   each gets its rank, local rank and the peer table. A key-value slot per run
//!   carries opaque bytes such as the NCCL unique id. An elastic run (joins with
//!   `max_size` > 0) is a sequence of worlds, its [`generations`]: members
//!   come and go, and each change re-forms the world with dense ranks.
//! - **Weights**: rank 0 (or a file) publishes the initial weights as a stream of
//!   chunks with a sha256; the others stream them down. Blobs are files in the
//!   store, visible only once complete and verified.
//! - **Metrics**: ranks stream points; clients query them aggregated across ranks
//!   or raw, and watch them while the job runs.
//!
//! Plus gRPC health and reflection. Everything durable (runs, blob metadata,
//! metric points) is in an embedded SQLite database in WAL mode, so a coordinator
//! that is killed and restarted on the same store has every point it
//! acknowledged. A bearer token, when configured, guards every drove call and
//! reflection (health stays open for orchestrators' probes). TLS is optional.
//!
//! Configuration: defaults < TOML file < `DROVE_*` environment < flags ([`Config`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = drove_coordinator::Config { listen: "127.0.0.1:0".parse()?, ..Default::default() };
//! let server = drove_coordinator::start(&config).await?;
//! println!("coordinator on {}", server.addr());
//! server.shutdown().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod generations;
mod metrics;
pub mod prometheus;
mod rendezvous;
mod serve;
mod validate;
mod weights;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use drove_proto::v1::metrics_server::MetricsServer;
use drove_proto::v1::rendezvous_server::RendezvousServer;
use drove_proto::v1::weights_server::WeightsServer;
use drove_store::{self as store, run_state};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

pub use metrics::MetricsService;
pub use rendezvous::RendezvousService;
pub use serve::{ServeError, run_until_signal, serve_in_process, serve_until_signal};
pub use weights::WeightsService;

/// Coordinator settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// Folder of the embedded store (created if missing).
    pub store: PathBuf,
    /// Bearer token every call must carry; none: no authentication.
    pub token: Option<String>,
    /// TLS certificate chain (PEM); with `tls_key`, serves TLS.
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// How long a join waits for its world by default, in milliseconds.
    pub join_timeout_ms: u64,
    /// Largest blob chunk accepted, in bytes.
    pub max_chunk_bytes: usize,
    /// A rank of a running run that has sent heartbeats and then sends none for
    /// this long fails the run (hung or stopped), in milliseconds.
    pub heartbeat_timeout_ms: u64,
    /// Where to serve Prometheus metrics (`GET /metrics`); none: not served.
    pub metrics_listen: Option<SocketAddr>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            store: PathBuf::from("drove-store"),
            token: None,
            tls_cert: None,
            tls_key: None,
            join_timeout_ms: 60_000,
            max_chunk_bytes: 4 << 20,
            heartbeat_timeout_ms: 30_000,
            metrics_listen: None,
        }
    }
}

/// Settings given as command-line flags (absent ones leave lower layers alone).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Overrides {
    /// `--listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// `--store`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<PathBuf>,
    /// `--token`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// `--tls-cert`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// `--join-timeout-ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join_timeout_ms: Option<u64>,
    /// `--heartbeat-timeout-ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout_ms: Option<u64>,
    /// `--metrics-listen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<SocketAddr>,
}

/// Environment variables read, after the `DROVE_` prefix.
const ENV_KEYS: &[&str] = &[
    "listen",
    "store",
    "token",
    "tls_cert",
    "tls_key",
    "join_timeout_ms",
    "max_chunk_bytes",
    "heartbeat_timeout_ms",
    "metrics_listen",
];

impl Config {
    /// Defaults < `file` (TOML, if given) < `DROVE_*` environment < `flags`.
    pub fn load(file: Option<&Path>, flags: &Overrides) -> Result<Config, Box<figment::Error>> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            fig = fig.merge(Toml::file_exact(file));
        }
        fig = fig.merge(Env::prefixed("DROVE_").only(ENV_KEYS)).merge(Serialized::defaults(flags));
        let config: Config = fig.extract().map_err(Box::new)?;
        Ok(config)
    }
}

/// A coordinator that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// TLS is misconfigured.
    #[error("TLS: {0}")]
    Tls(String),
    /// The reflection service could not be built.
    #[error("reflection: {0}")]
    Reflection(String),
}

/// Checks the bearer token.
#[derive(Clone)]
struct Auth(Option<Arc<str>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else { return Ok(req) };
        let given = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        let expected = format!("Bearer {token}");
        // Constant-time comparison: no early exit on the first differing byte.
        let same = given.len() == expected.len()
            && given.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if same {
            Ok(req)
        } else if given.is_empty() {
            Err(Status::unauthenticated(
                "this coordinator requires a bearer token (authorization: Bearer TOKEN)",
            ))
        } else {
            Err(Status::unauthenticated("the bearer token is wrong"))
        }
    }
}

/// A running coordinator.
pub struct Server {
    addr: SocketAddr,
    closing: tokio::sync::watch::Sender<bool>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    _watchdog: AbortOnDrop,
    metrics_addr: Option<SocketAddr>,
    _exporter: Option<AbortOnDrop>,
}

/// A background task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Server {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where it serves Prometheus metrics (`/metrics`), if it does.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stops accepting calls, lets running ones finish for up to 5 s (open
    /// watch streams never finish by themselves), then drops the rest.
    pub async fn shutdown(mut self) {
        self.closing.send_replace(true); // ends watch streams
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.task).await.is_err() {
            self.task.abort();
            let _ = (&mut self.task).await;
        }
    }

    /// Waits until the server stops (on error).
    pub async fn wait(self) -> Result<(), tonic::transport::Error> {
        match self.task.await {
            Ok(r) => r,
            Err(e) => panic!("the coordinator task panicked: {e}"),
        }
    }
}

/// Opens the store, binds, and serves in a background task.
pub async fn start(config: &Config) -> Result<Server, StartError> {
    let store = store::Store::open(&config.store)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| StartError::Bind { addr: config.listen, source })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind { addr: config.listen, source })?;
    let auth = Auth(config.token.as_deref().map(Arc::from));
    let max_message = config.max_chunk_bytes + (1 << 20);

    let rendezvous_service =
        RendezvousService::new(store.clone(), Duration::from_millis(config.join_timeout_ms))?;
    let watchdog =
        watch_heartbeats(rendezvous_service.clone(), Duration::from_millis(config.heartbeat_timeout_ms));
    let rendezvous = RendezvousServer::new(rendezvous_service);
    let weights = WeightsServer::new(WeightsService::new(store.clone(), config.max_chunk_bytes))
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    let (closing, closing_rx) = tokio::sync::watch::channel(false);
    let metrics_service = MetricsService::new(store.clone(), closing_rx);
    let exporter = start_exporter(config, &store, metrics_service.counters()).await?;
    let metrics = MetricsServer::new(metrics_service).max_decoding_message_size(64 << 20);
    let (reflection, reflection_v1alpha) = reflection()?;
    let health = health().await;
    let router = transport(config)?
        .add_service(health)
        .add_service(InterceptedService::new(reflection, auth.clone()))
        .add_service(InterceptedService::new(reflection_v1alpha, auth.clone()))
        .add_service(InterceptedService::new(rendezvous, auth.clone()))
        .add_service(InterceptedService::new(weights, auth.clone()))
        .add_service(InterceptedService::new(metrics, auth));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        router
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await
    });
    tracing::info!(%addr, store = %config.store.display(), auth = config.token.is_some(), "coordinator serving");
    let (metrics_addr, exporter) = exporter.unzip();
    Ok(Server {
        addr,
        metrics_addr,
        closing,
        shutdown: Some(tx),
        task,
        _watchdog: AbortOnDrop(watchdog),
        _exporter: exporter,
    })
}

/// The Prometheus exporter on `config.metrics_listen`, if one is set: the
/// address it listens on and its task.
async fn start_exporter(
    config: &Config,
    store: &store::Store,
    counters: Arc<prometheus::Counters>,
) -> Result<Option<(SocketAddr, AbortOnDrop)>, StartError> {
    let Some(at) = config.metrics_listen else { return Ok(None) };
    let listener = prometheus::bind(at).await.map_err(|source| StartError::Bind { addr: at, source })?;
    let bound = listener.local_addr().map_err(|source| StartError::Bind { addr: at, source })?;
    let task = tokio::spawn(prometheus::serve(listener, store.clone(), counters));
    Ok(Some((bound, AbortOnDrop(task))))
}

/// Reflection in both versions: `v1`, and `v1alpha` for the clients that
/// speak only it (grpcurl 1.8 and older, grpcio-reflection's Python client).
#[allow(clippy::type_complexity)]
fn reflection() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    StartError,
> {
    let descriptors = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(drove_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = descriptors().build_v1().map_err(|e| StartError::Reflection(e.to_string()))?;
    let reflection_v1alpha =
        descriptors().build_v1alpha().map_err(|e| StartError::Reflection(e.to_string()))?;
    Ok((reflection, reflection_v1alpha))
}

/// `grpc.health.v1`, saying the three services serve.
async fn health()
-> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<RendezvousServer<RendezvousService>>().await;
    health_reporter.set_serving::<WeightsServer<WeightsService>>().await;
    health_reporter.set_serving::<MetricsServer<MetricsService>>().await;
    health
}

/// The gRPC transport: windows sized for streaming blobs, and TLS when the
/// config names a certificate and its key (one without the other is an error).
fn transport(config: &Config) -> Result<tonic::transport::Server, StartError> {
    let builder = tonic::transport::Server::builder()
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(32 << 20))
        .max_frame_size(Some(1 << 20))
        .tcp_nodelay(true);
    match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            let read =
                |p: &PathBuf| std::fs::read(p).map_err(|e| StartError::Tls(format!("{}: {e}", p.display())));
            let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
            builder
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(|e| StartError::Tls(e.to_string()))
        }
        (None, None) => Ok(builder),
        _ => Err(StartError::Tls("tls_cert and tls_key must be given together".into())),
    }
}

/// Checks the running runs' heartbeats every tenth of `timeout` (at most
/// every second), failing runs whose ranks fell silent.
fn watch_heartbeats(service: RendezvousService, timeout: Duration) -> tokio::task::JoinHandle<()> {
    let period = (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let service = service.clone();
            let _ = tokio::task::spawn_blocking(move || service.fail_silent_ranks(timeout)).await;
        }
    })
}

/// Command-line flags of `drove-coordinator` and `drove coordinator`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Flags {
    /// Address to listen on, e.g. 0.0.0.0:50051 (port 0: any free port).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Folder of the embedded store.
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// Bearer token every call must carry.
    #[arg(long)]
    pub token: Option<String>,
    /// TOML configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// TLS certificate chain (PEM).
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Default time a join waits for its world, in milliseconds.
    #[arg(long)]
    pub join_timeout_ms: Option<u64>,
    /// A rank that sent heartbeats and then none for this long fails its run
    /// (hung or stopped), in milliseconds [default: 30000].
    #[arg(long)]
    pub heartbeat_timeout_ms: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 0.0.0.0:9090; off by default).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

impl Flags {
    /// The configuration these flags select (defaults < file < env < flags).
    pub fn config(&self) -> Result<Config, Box<figment::Error>> {
        let overrides = Overrides {
            listen: self.listen,
            store: self.store.clone(),
            token: self.token.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            join_timeout_ms: self.join_timeout_ms,
            heartbeat_timeout_ms: self.heartbeat_timeout_ms,
            metrics_listen: self.metrics_listen,
        };
        Config::load(self.config.as_deref(), &overrides)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail API returns its own error type
    fn configuration_layers_defaults_file_environment_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("c.toml", "listen = \"127.0.0.1:7000\"\nstore = \"from-file\"\ntoken = \"file-token\"\njoin_timeout_ms = 5")?;
            let base = Config::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(base, Config::default());
            let file =
                Config::load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(
                (file.listen.port(), file.store.to_str(), file.join_timeout_ms),
                (7000, Some("from-file"), 5)
            );
            jail.set_env("DROVE_STORE", "from-env");
            jail.set_env("DROVE_TOKEN", "env-token");
            jail.set_env("DROVE_RANK", "3"); // other DROVE_* variables are not the coordinator's
            let env =
                Config::load(Some(Path::new("c.toml")), &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(
                (env.store.to_str(), env.token.as_deref(), env.listen.port()),
                (Some("from-env"), Some("env-token"), 7000)
            );
            let flags = Overrides { store: Some("from-flag".into()), ..Default::default() };
            let top = Config::load(Some(Path::new("c.toml")), &flags).map_err(|e| e.to_string())?;
            assert_eq!((top.store.to_str(), top.token.as_deref()), (Some("from-flag"), Some("env-token")));
            jail.create_file("bad.toml", "listen = \"not an address\"")?;
            let err =
                Config::load(Some(Path::new("bad.toml")), &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains("listen"), "{err}");
            Ok(())
        });
    }
}

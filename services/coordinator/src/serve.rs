//! The ways a program serves a coordinator: in-process on a store (what `drove
//! run`'s launcher, a Slurm or torchrun rank 0 and `drove runs --store` do),
//! and from flags until a signal (`drove coordinator`, `drove-coordinator`).

use std::net::SocketAddr;
use std::path::Path;

use crate::{Config, Flags, Server, StartError, start};

/// Serves a coordinator in this process on `listen` (port 0: any free one;
/// [`Server::addr`] says which), its store in `store` (created if missing),
/// requiring `token` if given, and Prometheus' `/metrics` on `metrics_listen`
/// if given ([`Server::metrics_addr`] says where). Call it inside a tokio runtime.
pub async fn serve_in_process(
    listen: SocketAddr,
    store: &Path,
    token: Option<&str>,
    metrics_listen: Option<SocketAddr>,
) -> Result<Server, StartError> {
    let config = Config {
        listen,
        store: store.to_path_buf(),
        token: token.map(str::to_string),
        metrics_listen,
        ..Default::default()
    };
    start(&config).await
}

/// Serves until SIGINT or SIGTERM, printing `listening on ADDR` on stdout first.
pub async fn serve_until_signal(config: &Config) -> Result<(), StartError> {
    let server = start(config).await?;
    println!("drove-coordinator listening on {}", server.addr());
    if let Some(at) = server.metrics_addr() {
        println!("drove-coordinator serves Prometheus metrics at http://{at}/metrics");
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| StartError::Bind { addr: server.addr(), source })?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    server.shutdown().await;
    Ok(())
}

/// Why [`run_until_signal`] could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The flags, file or environment do not make a configuration.
    #[error("reading the coordinator's configuration: {0}")]
    Config(String),
    /// No runtime could be started.
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
    /// The coordinator did not start (or its signal handler did not).
    #[error("the coordinator cannot start: {0}")]
    Start(StartError),
}

/// Serves the coordinator that `flags` configure (defaults < file < env <
/// flags) until SIGINT or SIGTERM, on a multi-thread runtime of its own,
/// printing `drove-coordinator listening on ADDR` first. Blocks.
pub fn run_until_signal(flags: &Flags) -> Result<(), ServeError> {
    let config = flags.config().map_err(|e| ServeError::Config(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("drove-coordinator")
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(serve_until_signal(&config)).map_err(ServeError::Start)
}

//! The one way drove's own programs start a coordinator in-process: on
//! `listen`, with its store in `store`, and a bearer token if any; and
//! `drove coordinator`'s serving from its flags until a signal.

use std::net::SocketAddr;
use std::path::Path;

pub use drove_coordinator::{Flags, Server, StartError};

/// Serves a coordinator in this process on `listen` (port 0: any free one;
/// [`Server::addr`] says which), its store in `store` (created if missing),
/// requiring `token` if given. Call it inside a tokio runtime.
pub async fn serve_in_process(
    listen: SocketAddr,
    store: &Path,
    token: Option<&str>,
) -> Result<Server, StartError> {
    let config = drove_coordinator::Config {
        listen,
        store: store.to_path_buf(),
        token: token.map(str::to_string),
        ..Default::default()
    };
    drove_coordinator::start(&config).await
}

/// Why [`serve_until_signal`] could not serve.
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
pub fn serve_until_signal(flags: &Flags) -> Result<(), ServeError> {
    let config = flags.config().map_err(|e| ServeError::Config(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("drove-coordinator")
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(drove_coordinator::serve_until_signal(&config)).map_err(ServeError::Start)
}

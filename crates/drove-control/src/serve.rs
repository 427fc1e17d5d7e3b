//! The one way drove's own programs start a coordinator in-process: on
//! `listen`, with its store in `store`, and a bearer token if any.

use std::net::SocketAddr;
use std::path::Path;

pub use drove_coordinator::{Server, StartError};

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

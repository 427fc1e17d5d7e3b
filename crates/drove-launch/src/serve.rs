//! The coordinator a launcher or a rank 0 serves in this process: the
//! coordinator's own server with feature `serve` (on by default), else none
//! (a program that only reads the launch contract, like the Python package,
//! links no server, no SQLite): asked to serve, it says how to name a
//! running coordinator instead.

use std::net::SocketAddr;
use std::path::Path;

#[cfg(feature = "serve")]
pub(crate) use drove_coordinator::Server;

/// No server in this build (feature `serve` off): never made.
#[cfg(not(feature = "serve"))]
pub(crate) enum Server {}

#[cfg(not(feature = "serve"))]
impl Server {
    pub fn addr(&self) -> SocketAddr {
        match *self {}
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        match *self {}
    }

    pub async fn shutdown(self) {
        match self {}
    }
}

/// Serves a coordinator on `listen` with its store in `store`, requiring
/// `token` if given, and Prometheus' `/metrics` on `metrics_listen` if given
/// (inside a tokio runtime); why not, as text.
pub(crate) async fn in_process(
    listen: SocketAddr,
    store: &Path,
    token: Option<&str>,
    metrics_listen: Option<SocketAddr>,
) -> Result<Server, String> {
    #[cfg(feature = "serve")]
    {
        drove_coordinator::serve_in_process(listen, store, token, metrics_listen)
            .await
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "serve"))]
    {
        let _ = (listen, store, token, metrics_listen);
        Err(format!(
            "this build of drove-launch serves no coordinator (its feature `serve` is off): start one \
             (`drove coordinator`) and name it in {}",
            crate::var::COORDINATOR
        ))
    }
}

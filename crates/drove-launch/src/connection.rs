//! How either side reaches a coordinator: the launcher, a rank, a program
//! that queries one.

use std::path::PathBuf;

use drove_control::{Clients, Connection};

use crate::error::LaunchError;

/// How to reach the coordinator at `addr` (`host:port` or a URL) with `token`
/// (if any), trusting the CA named by `DROVE_TLS_CA` for `https://`.
pub fn connection(addr: &str, token: Option<&str>) -> Connection {
    Connection::new(addr, token).with_tls_ca(std::env::var_os(crate::var::TLS_CA).map(PathBuf::from))
}

/// Connects to the coordinator at `addr` with `token` (see [`connection`]).
/// The error names the address and the cause.
pub async fn coordinator_clients(addr: &str, token: Option<&str>) -> Result<Clients, LaunchError> {
    connection(addr, token).connect().await.map_err(|e| LaunchError::Coordinator(e.to_string()))
}

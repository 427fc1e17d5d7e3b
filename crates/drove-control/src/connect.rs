//! Connections to a coordinator: the endpoint (larger HTTP/2 windows and
//! frames for blob streaming, a connect timeout, TLS trust from a given CA
//! file), the bearer token on every call, and the three clients over one
//! connection. Nothing here reads the environment: the caller passes the
//! address, the token and the CA file (drove-launch reads `DROVE_TLS_CA`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use drove_proto::v1::metrics_client::MetricsClient;
use drove_proto::v1::rendezvous_client::RendezvousClient;
use drove_proto::v1::weights_client::WeightsClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

/// Largest message a client accepts (blob chunks are at most 4 MiB by default).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Why a connection could not be made; each message names the address.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address is not a URL or `host:port`, or its TLS settings are unusable.
    #[error("{addr:?} is not a usable coordinator address (host:port, http:// or https://): {message}")]
    Address {
        /// The address as given.
        addr: String,
        /// Why.
        message: String,
    },
    /// The token cannot travel in an HTTP header.
    #[error("the token cannot be sent in an HTTP header: {0}")]
    Token(String),
    /// Nothing answered at the address.
    #[error("cannot connect to the coordinator at {addr}: {causes}")]
    Unreachable {
        /// The address as given.
        addr: String,
        /// The transport error's causes, without tonic's generic words.
        causes: String,
    },
}

/// Adds `authorization: Bearer TOKEN` to every call when a token is set.
#[derive(Clone, Debug, Default)]
pub struct Token(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl Token {
    /// A token, or none.
    pub fn new(token: Option<&str>) -> Result<Self, tonic::metadata::errors::InvalidMetadataValue> {
        Ok(Token(token.map(|t| format!("Bearer {t}").parse()).transpose()?))
    }
}

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel with the token applied.
pub type Authed = InterceptedService<Channel, Token>;

/// The endpoint for `addr` (`host:port`, `http://...` or `https://...`), with
/// windows sized for streaming blobs and a connect timeout. For `https://`,
/// the server certificate is checked against the PEM file `ca` (which must
/// then be given).
pub fn endpoint(addr: &str, ca: Option<&Path>) -> Result<Endpoint, ConnectError> {
    let bad = |message: String| ConnectError::Address { addr: addr.to_string(), message };
    let url = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    let mut endpoint = Endpoint::from_shared(url.clone()).map_err(|e| bad(e.to_string()))?;
    if url.starts_with("https://") {
        let ca_path = ca.ok_or_else(|| {
            bad(format!("{addr} uses TLS: set DROVE_TLS_CA to the PEM file of its certificate authority"))
        })?;
        let ca =
            std::fs::read(ca_path).map_err(|e| bad(format!("DROVE_TLS_CA={}: {e}", ca_path.display())))?;
        endpoint = endpoint
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(ca)),
            )
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(endpoint
        .connect_timeout(Duration::from_secs(10))
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(32 << 20))
        .max_frame_size(Some(1 << 20))
        .tcp_nodelay(true))
}

/// "cannot connect": the causes, without tonic's generic "transport error" and
/// repeated layers.
fn unreachable(addr: &str, e: &tonic::transport::Error) -> ConnectError {
    let mut causes: Vec<String> = Vec::new();
    let mut cause: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if text != "transport error" && causes.last() != Some(&text) {
            causes.push(text);
        }
        cause = c.source();
    }
    ConnectError::Unreachable { addr: addr.to_string(), causes: causes.join(": ") }
}

/// Where a coordinator is and how to reach it: its address (`host:port` or a
/// URL), the bearer token if any, and the CA file to trust for `https://`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Connection {
    /// `host:port`, `http://...` or `https://...`.
    pub addr: String,
    /// The bearer token sent on every call, if any.
    pub token: Option<String>,
    /// The PEM file of the certificate authority for `https://` addresses.
    pub tls_ca: Option<PathBuf>,
}

impl Connection {
    /// The coordinator at `addr`, with `token` if given and no CA file.
    pub fn new(addr: &str, token: Option<&str>) -> Self {
        Connection { addr: addr.to_string(), token: token.map(str::to_string), tls_ca: None }
    }

    /// The same, trusting the CA in the PEM file `ca` (if any) for `https://`.
    pub fn with_tls_ca(mut self, ca: Option<PathBuf>) -> Self {
        self.tls_ca = ca;
        self
    }

    /// The endpoint (see [`endpoint`]).
    pub fn endpoint(&self) -> Result<Endpoint, ConnectError> {
        endpoint(&self.addr, self.tls_ca.as_deref())
    }

    /// A channel without the token (for the health service, say).
    pub async fn channel(&self) -> Result<Channel, ConnectError> {
        self.endpoint()?.connect().await.map_err(|e| unreachable(&self.addr, &e))
    }

    /// A channel with the token on every call.
    pub async fn authed(&self) -> Result<Authed, ConnectError> {
        let channel = self.channel().await?;
        let token = Token::new(self.token.as_deref()).map_err(|e| ConnectError::Token(e.to_string()))?;
        Ok(InterceptedService::new(channel, token))
    }

    /// The three clients over one connection.
    pub async fn connect(&self) -> Result<Clients, ConnectError> {
        Ok(Clients::new(self.authed().await?))
    }
}

/// The three clients over one connection.
#[derive(Clone, Debug)]
pub struct Clients {
    /// Rendezvous.
    pub rendezvous: RendezvousClient<Authed>,
    /// Weights.
    pub weights: WeightsClient<Authed>,
    /// Metrics.
    pub metrics: MetricsClient<Authed>,
}

impl Clients {
    /// Clients over `channel`, accepting messages up to [`MAX_MESSAGE_BYTES`].
    pub fn new(channel: Authed) -> Self {
        Clients {
            rendezvous: RendezvousClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES),
            weights: WeightsClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            metrics: MetricsClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES),
        }
    }

    /// Connects to the coordinator at `addr` without a CA file (plain
    /// `http://`) and builds the clients.
    pub async fn connect(addr: &str, token: Option<&str>) -> Result<Self, ConnectError> {
        Connection::new(addr, token).connect().await
    }
}

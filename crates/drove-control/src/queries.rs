//! The questions programs ask a coordinator about its runs: the runs and
//! their generations, a run's points (raw or aggregated), its new points as
//! they arrive, and a health check. Each takes a [`Connection`] and returns
//! the proto messages; every error keeps the gRPC code and message
//! ([`QueryError`], one line naming the code).

use std::future::Future;
use std::time::Duration;

use drove_proto::v1::{
    BlobInfo, FetchChunk, FetchRequest, Generation, GenerationsRequest, JoinRequest, JoinResponse,
    ListRunsRequest, MetricPoint, PublishChunk, PushRequest, QueryPoint, QueryRequest, RunInfo, WatchRequest,
};
use tonic::{Code, IntoStreamingRequest};
pub use tonic_health::pb::health_check_response::ServingStatus;

use crate::connect::{Clients, ConnectError, Connection};
use crate::launcher::status_line;

/// A query the coordinator refused or did not answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The coordinator cannot be reached.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The call failed: its gRPC code and message, as one line, e.g.
    /// `the coordinator refused the call (Unauthenticated): the bearer token is wrong`.
    #[error("{}", status_line(*code, message))]
    Status {
        /// The gRPC status code.
        code: Code,
        /// The status message (may be empty).
        message: String,
    },
    /// The generations of a run could not be listed.
    #[error("asking for the generations of run {run:?}")]
    Generations {
        /// The run.
        run: String,
        /// Why.
        #[source]
        source: Box<QueryError>,
    },
    /// No answer to a health check in time.
    #[error("the coordinator at {addr} did not answer a health check within {limit:?}")]
    HealthTimeout {
        /// The coordinator's address.
        addr: String,
        /// How long it was given.
        limit: Duration,
    },
}

impl From<tonic::Status> for QueryError {
    fn from(status: tonic::Status) -> Self {
        QueryError::Status { code: status.code(), message: status.message().to_string() }
    }
}

impl QueryError {
    /// The gRPC code, when the call itself failed.
    pub fn code(&self) -> Option<Code> {
        match self {
            QueryError::Status { code, .. } => Some(*code),
            QueryError::Generations { source, .. } => source.code(),
            _ => None,
        }
    }
}

/// Every run the coordinator knows (ListRuns).
pub async fn list_runs(connection: &Connection) -> Result<Vec<RunInfo>, QueryError> {
    let mut clients = connection.connect().await?;
    Ok(clients.metrics.list_runs(ListRunsRequest {}).await?.into_inner().runs)
}

/// Every run with its generations (oldest first), over one connection.
pub async fn runs_with_generations(
    connection: &Connection,
) -> Result<Vec<(RunInfo, Vec<Generation>)>, QueryError> {
    let mut clients = connection.connect().await?;
    let runs = clients.metrics.list_runs(ListRunsRequest {}).await?.into_inner().runs;
    let mut listed = Vec::with_capacity(runs.len());
    for run in runs {
        let generations = generations(&mut clients, &run.run_id).await?;
        listed.push((run, generations));
    }
    Ok(listed)
}

/// The generations of run `run_id`, oldest first: none for a fixed-world
/// run, and none from a coordinator that has no Generations call or does
/// not know the run (it only recorded points).
pub async fn generations(clients: &mut Clients, run_id: &str) -> Result<Vec<Generation>, QueryError> {
    let request = GenerationsRequest { run_id: run_id.to_string() };
    match clients.rendezvous.generations(request).await {
        Ok(reply) => Ok(reply.into_inner().generations),
        Err(s) if matches!(s.code(), Code::NotFound | Code::Unimplemented) => Ok(Vec::new()),
        Err(s) => Err(QueryError::Generations { run: run_id.to_string(), source: Box::new(s.into()) }),
    }
}

/// A run's points (Query): raw, or aggregated across ranks per (name, step).
pub async fn points(connection: &Connection, request: QueryRequest) -> Result<Vec<QueryPoint>, QueryError> {
    let mut clients = connection.connect().await?;
    Ok(clients.metrics.query(request).await?.into_inner().points)
}

/// The stored points of a run, then each new one as it arrives (Watch).
pub async fn watch(connection: &Connection, request: WatchRequest) -> Result<PointStream, QueryError> {
    let mut clients = connection.connect().await?;
    Ok(PointStream(clients.metrics.watch(request).await?.into_inner()))
}

/// The points of a [`watch`], one at a time.
#[derive(Debug)]
pub struct PointStream(tonic::Streaming<MetricPoint>);

impl PointStream {
    /// The next point; `None` once the stream ended.
    pub async fn next(&mut self) -> Result<Option<MetricPoint>, QueryError> {
        Ok(self.0.message().await?)
    }

    /// Calls `on_point` with each point until the stream ends, `stop`
    /// resolves, or `on_point` returns `Ok(false)` (all three: `Ok`).
    pub async fn for_each_until<E: From<QueryError>>(
        mut self,
        stop: impl Future<Output = ()>,
        mut on_point: impl FnMut(MetricPoint) -> Result<bool, E>,
    ) -> Result<(), E> {
        tokio::pin!(stop);
        loop {
            let point = tokio::select! {
                _ = &mut stop => return Ok(()),
                msg = self.next() => match msg? {
                    Some(p) => p,
                    None => return Ok(()),
                },
            };
            if !on_point(point)? {
                return Ok(());
            }
        }
    }
}

/// One `grpc.health.v1.Health/Check` of `service` (empty: the server as a
/// whole), without the token, connecting included within `limit`.
pub async fn health(
    connection: &Connection,
    service: &str,
    limit: Duration,
) -> Result<ServingStatus, QueryError> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let check = async {
        let channel = connection.channel().await?;
        let reply =
            HealthClient::new(channel).check(HealthCheckRequest { service: service.to_string() }).await?;
        Ok(reply.into_inner().status())
    };
    tokio::time::timeout(limit, check)
        .await
        .map_err(|_| QueryError::HealthTimeout { addr: connection.addr.clone(), limit })?
}

/// One Join on `clients` (as a load generator makes them: one call, no retry).
pub async fn join(clients: &mut Clients, request: JoinRequest) -> Result<JoinResponse, QueryError> {
    Ok(clients.rendezvous.join(request).await?.into_inner())
}

/// One Push stream of `batches` (a `futures` stream, say), read to its end:
/// the number of points the last acknowledgement says are stored.
pub async fn push(
    clients: &mut Clients,
    batches: impl IntoStreamingRequest<Message = PushRequest>,
) -> Result<u64, QueryError> {
    let mut acks = clients.metrics.push(batches).await?.into_inner();
    let mut stored = 0;
    while let Some(ack) = acks.message().await? {
        stored = ack.stored;
    }
    Ok(stored)
}

/// One Publish of a blob's `chunks` (the first with the header): what the
/// coordinator stored.
pub async fn publish(
    clients: &mut Clients,
    chunks: impl IntoStreamingRequest<Message = PublishChunk>,
) -> Result<BlobInfo, QueryError> {
    Ok(clients.weights.publish(chunks).await?.into_inner())
}

/// One Fetch of a blob: its chunks, one at a time.
pub async fn fetch(clients: &mut Clients, request: FetchRequest) -> Result<ChunkStream, QueryError> {
    Ok(ChunkStream(clients.weights.fetch(request).await?.into_inner()))
}

/// The chunks of a [`fetch`].
#[derive(Debug)]
pub struct ChunkStream(tonic::Streaming<FetchChunk>);

impl ChunkStream {
    /// The next chunk; `None` once the blob is complete.
    pub async fn next(&mut self) -> Result<Option<FetchChunk>, QueryError> {
        Ok(self.0.message().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_errors_name_the_code_and_the_message() {
        let e = QueryError::from(tonic::Status::unauthenticated("the bearer token is wrong"));
        assert_eq!(
            e.to_string(),
            "the coordinator refused the call (Unauthenticated): the bearer token is wrong"
        );
        let e = QueryError::from(tonic::Status::unavailable(""));
        assert_eq!(e.to_string(), "the call to the coordinator failed (Unavailable)");
        assert_eq!(e.code(), Some(Code::Unavailable));
    }
}

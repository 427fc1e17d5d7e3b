//! A run read from a coordinator over gRPC: its runs (ListRuns) and the
//! run's raw points (Query). Every gRPC call of the crate is here, through
//! drove-proto's generated clients, so that the whole client side can move
//! into one crate of its own without touching the rest.

use drove_proto::v1::{Aggregation, ListRunsRequest, QueryRequest, RunInfo};

use crate::data::pick;
use crate::{Event, Point, ReportError, RunData};

impl RunData {
    /// Asks the coordinator at `addr` (`host:port` or a URL, with `token` on
    /// every call if given) for run `wanted` (default: the newest) and its raw
    /// points, on a runtime of its own. From async code, call
    /// [`RunData::query`] instead.
    pub fn from_coordinator(
        addr: &str,
        token: Option<&str>,
        wanted: Option<&str>,
    ) -> Result<RunData, ReportError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("drove-report")
            .build()
            .map_err(ReportError::Runtime)?;
        rt.block_on(RunData::query(addr, token, wanted))
    }

    /// [`RunData::from_coordinator`] on the caller's tokio runtime.
    pub async fn query(
        addr: &str,
        token: Option<&str>,
        wanted: Option<&str>,
    ) -> Result<RunData, ReportError> {
        let status = |s| ReportError::Status(drove_launch::status_message(&s));
        let mut clients = drove_launch::connect(addr, token).await?;
        let runs = clients.metrics.list_runs(ListRunsRequest {}).await.map_err(status)?.into_inner().runs;
        let at = format!("the coordinator at {addr}");
        let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
        let id = pick(&ids, wanted, &at)?.to_string();
        let info: RunInfo = runs.into_iter().find(|r| r.run_id == id).expect("picked among them");
        let query = QueryRequest {
            run_id: id.clone(),
            aggregation: Aggregation::Raw as i32,
            ..QueryRequest::default()
        };
        let points = clients
            .metrics
            .query(query)
            .await
            .map_err(|s| ReportError::Query { run: id.clone(), message: drove_launch::status_message(&s) })?
            .into_inner()
            .points;
        Ok(RunData {
            state: info.state(),
            run_id: info.run_id,
            world_size: info.world_size,
            joined: info.joined,
            restarts: info.restarts,
            created_unix_ms: info.created_unix_ms,
            updated_unix_ms: info.updated_unix_ms,
            events: info.events.into_iter().map(Event::from).collect(),
            points: points.into_iter().map(Point::from).collect(),
        })
    }
}

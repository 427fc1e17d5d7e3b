//! A run read from a coordinator: its runs (ListRuns) and the run's raw
//! points (Query), through drove-control's queries.

use drove_control::{Connection, QueryError};
use drove_proto::v1::{Aggregation, QueryRequest, RunInfo};

use crate::data::pick;
use crate::{Event, Point, ReportError, RunData};

impl RunData {
    /// Asks the coordinator `connection` reaches (its address, token and CA)
    /// for run `wanted` (default: the newest) and its raw points, on
    /// drove-control's runtime. From async code, call [`RunData::query`]
    /// instead.
    pub fn from_coordinator(connection: &Connection, wanted: Option<&str>) -> Result<RunData, ReportError> {
        drove_control::runtime::block_on(RunData::query(connection, wanted)).map_err(ReportError::Runtime)?
    }

    /// [`RunData::from_coordinator`] on the caller's tokio runtime.
    pub async fn query(connection: &Connection, wanted: Option<&str>) -> Result<RunData, ReportError> {
        let addr = &connection.addr;
        let runs = drove_control::queries::list_runs(connection).await.map_err(|e| match e {
            QueryError::Connect(e) => ReportError::Connect(e),
            e => ReportError::Status(e.to_string()),
        })?;
        let at = format!("the coordinator at {addr}");
        let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
        let id = pick(&ids, wanted, &at)?.to_string();
        let info: RunInfo = runs.into_iter().find(|r| r.run_id == id).expect("picked among them");
        let query = QueryRequest {
            run_id: id.clone(),
            aggregation: Aggregation::Raw as i32,
            ..QueryRequest::default()
        };
        let points = drove_control::queries::points(connection, query)
            .await
            .map_err(|e| ReportError::Query { run: id.clone(), message: e.to_string() })?;
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

//! A run as `drove report` reads it: what the coordinator knows of it, its
//! events and every raw point, from a store folder or from a coordinator.

use std::path::Path;

use anyhow::{Context, anyhow, bail};
use drove_coordinator::store::{self, EventRow, Filter, Store};
use drove_proto::metric_names;
use drove_proto::v1::{Aggregation, ListRunsRequest, QueryPoint, QueryRequest, RunEvent, RunInfo, RunState};
use serde::{Serialize, Serializer};

use super::Source;
use crate::control::{connect, runtime, status_error};

/// Something that happened to the run (its options, the diversity alarm).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    /// The rank that saw it.
    pub rank: i32,
    /// The step.
    pub step: f64,
    /// `options`, `diversity_alarm`, ...
    pub kind: String,
    /// What it says.
    pub message: String,
    /// When, Unix milliseconds.
    pub wall_time_unix_ms: i64,
}

/// One point as recorded by one rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Point {
    /// The metric.
    pub name: String,
    /// The step.
    pub step: f64,
    /// The rank.
    pub rank: i32,
    /// The value.
    pub value: f64,
}

/// A state as its word (`running`, ...), as people read it.
fn state_word<S: Serializer>(state: &RunState, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.word())
}

/// A run and its points.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunData {
    /// The run.
    pub run_id: String,
    /// Rendezvous, running, finished, failed or metrics-only (in
    /// `report.json`, as its word).
    #[serde(serialize_with = "state_word")]
    pub state: RunState,
    /// Expected workers (0 if unknown).
    pub world_size: i32,
    /// Workers joined.
    pub joined: i32,
    /// Times the world was restarted.
    pub restarts: i32,
    /// First seen, Unix milliseconds.
    pub created_unix_ms: i64,
    /// Last change, Unix milliseconds.
    pub updated_unix_ms: i64,
    /// Its events, oldest first.
    pub events: Vec<Event>,
    /// Every point, ordered by name, step and rank.
    #[serde(skip)]
    pub points: Vec<Point>,
}

impl From<EventRow> for Event {
    fn from(e: EventRow) -> Event {
        Event { rank: e.rank, step: e.step, kind: e.kind, message: e.message, wall_time_unix_ms: e.wall_ms }
    }
}

impl From<RunEvent> for Event {
    fn from(e: RunEvent) -> Event {
        let wall_time_unix_ms = e.wall_time_unix_ms;
        Event { rank: e.rank, step: e.step, kind: e.kind, message: e.message, wall_time_unix_ms }
    }
}

impl From<store::Point> for Point {
    fn from(p: store::Point) -> Point {
        Point { name: p.name, step: p.step, rank: p.rank, value: p.value }
    }
}

impl From<QueryPoint> for Point {
    fn from(p: QueryPoint) -> Point {
        Point { name: p.name, step: p.step, rank: p.rank, value: p.value }
    }
}

impl RunData {
    /// The options the run recorded last (rank 0's `options` event: a JSON
    /// object), if any.
    pub fn options(&self) -> Option<serde_json::Map<String, serde_json::Value>> {
        let event = self.events.iter().rev().find(|e| e.kind == metric_names::event::OPTIONS)?;
        match serde_json::from_str(&event.message) {
            Ok(serde_json::Value::Object(o)) => Some(o),
            _ => None,
        }
    }
}

/// Reads run `run` (default: the newest) from `source`.
pub fn load(source: &Source<'_>, run: Option<&str>) -> anyhow::Result<RunData> {
    match source {
        Source::Store(dir) => from_store(dir, run),
        Source::Coordinator { addr, token } => {
            let rt = runtime("drove-report")?;
            rt.block_on(from_coordinator(addr, token.as_deref(), run))
        }
    }
}

/// The run called `wanted` among `ids` (newest first), else the newest; the
/// error lists the runs there are.
fn pick<'a>(ids: &[&'a str], wanted: Option<&str>, at: &str) -> anyhow::Result<&'a str> {
    match wanted {
        Some(w) => ids.iter().find(|id| **id == w).copied().ok_or_else(|| {
            let known = if ids.is_empty() { "none".to_string() } else { ids.join(", ") };
            anyhow!("{at} knows no run {w:?} (runs there: {known})")
        }),
        None => ids.first().copied().ok_or_else(|| anyhow!("{at} knows no runs")),
    }
}

/// Reads the store in `dir` in this process, read-only: beside a coordinator
/// that writes it, nothing is changed and neither blocks the other.
fn from_store(dir: &Path, wanted: Option<&str>) -> anyhow::Result<RunData> {
    if !dir.join("coordinator.db").is_file() {
        bail!("no coordinator store at {} (no coordinator.db in it)", dir.display());
    }
    let store =
        Store::open_read_only(dir).map_err(|e| anyhow!("opening the store {}: {e}", dir.display()))?;
    let at = format!("the store {}", dir.display());
    let runs = store.runs().map_err(|e| anyhow!("reading {at}: {e}"))?;
    let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
    let id = pick(&ids, wanted, &at)?;
    let r = runs.iter().find(|r| r.run_id == id).expect("picked among them");
    let events = store.events().map_err(|e| anyhow!("reading {at}: {e}"))?.remove(id).unwrap_or_default();
    let filter = Filter { run_id: id.to_string(), ..Filter::default() };
    let points = store.points(&filter, false).map_err(|e| anyhow!("reading {at}: {e}"))?;
    Ok(RunData {
        run_id: r.run_id.clone(),
        state: r.listed_state(),
        world_size: r.world_size,
        joined: r.joined,
        restarts: r.restarts,
        created_unix_ms: r.created_ms,
        updated_unix_ms: r.updated_ms,
        events: events.into_iter().map(Event::from).collect(),
        points: points.into_iter().map(Point::from).collect(),
    })
}

/// Asks the coordinator at `addr` for its runs and the run's raw points.
async fn from_coordinator(addr: &str, token: Option<&str>, wanted: Option<&str>) -> anyhow::Result<RunData> {
    let mut clients = connect(addr, token).await?;
    let runs = clients.metrics.list_runs(ListRunsRequest {}).await.map_err(status_error)?.into_inner().runs;
    let at = format!("the coordinator at {addr}");
    let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
    let id = pick(&ids, wanted, &at)?.to_string();
    let info: RunInfo = runs.into_iter().find(|r| r.run_id == id).expect("picked among them");
    let query =
        QueryRequest { run_id: id.clone(), aggregation: Aggregation::Raw as i32, ..QueryRequest::default() };
    let points = clients
        .metrics
        .query(query)
        .await
        .map_err(status_error)
        .with_context(|| format!("querying the points of run {id:?}"))?
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

//! A run as a report reads it: what the coordinator knows of it, its events
//! and every raw point, from a store folder or from a coordinator.

use std::path::Path;

use drove_proto::metric_names;
use drove_proto::v1::{QueryPoint, RunEvent, RunState};
use drove_store::{self as store, EventRow, Filter, Store};
use serde::{Serialize, Serializer};

use crate::ReportError;

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

impl From<store::PointRow> for Point {
    fn from(p: store::PointRow) -> Point {
        Point { name: p.name, step: p.step, rank: p.rank, value: p.value }
    }
}

impl From<QueryPoint> for Point {
    fn from(p: QueryPoint) -> Point {
        Point { name: p.name, step: p.step, rank: p.rank, value: p.value }
    }
}

/// Where the run is read from.
#[derive(Clone, Debug)]
pub enum Source<'a> {
    /// A store folder, read in this process.
    Store(&'a Path),
    /// A coordinator, over gRPC.
    Coordinator(drove_control::Connection),
}

/// Reads run `run` (default: the newest) from `source`.
pub fn load(source: &Source<'_>, run: Option<&str>) -> Result<RunData, ReportError> {
    match source {
        Source::Store(dir) => RunData::from_store(dir, run),
        Source::Coordinator(connection) => RunData::from_coordinator(connection, run),
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

    /// Reads run `wanted` (default: the newest) from the store in `dir`, in
    /// this process and read-only: beside a coordinator that writes it,
    /// nothing is changed and neither blocks the other.
    pub fn from_store(dir: &Path, wanted: Option<&str>) -> Result<RunData, ReportError> {
        if !dir.join("coordinator.db").is_file() {
            return Err(ReportError::NoStore(dir.to_path_buf()));
        }
        let store = Store::open_read_only(dir)
            .map_err(|cause| ReportError::OpenStore { dir: dir.to_path_buf(), cause })?;
        let at = format!("the store {}", dir.display());
        let read = |cause| ReportError::ReadStore { at: at.clone(), cause };
        let runs = store.runs().map_err(read)?;
        let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
        let id = pick(&ids, wanted, &at)?;
        let r = runs.iter().find(|r| r.run_id == id).expect("picked among them");
        let events = store.events().map_err(read)?.remove(id).unwrap_or_default();
        let filter = Filter { run_id: id.to_string(), ..Filter::default() };
        let points = store.points(&filter, false).map_err(read)?;
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
}

/// The run called `wanted` among `ids` (newest first), else the newest; the
/// error lists the runs there are.
pub(crate) fn pick<'a>(ids: &[&'a str], wanted: Option<&str>, at: &str) -> Result<&'a str, ReportError> {
    match wanted {
        Some(w) => ids.iter().find(|id| **id == w).copied().ok_or_else(|| ReportError::UnknownRun {
            at: at.to_string(),
            wanted: w.to_string(),
            known: if ids.is_empty() { "none".to_string() } else { ids.join(", ") },
        }),
        None => ids.first().copied().ok_or_else(|| ReportError::NoRuns { at: at.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_picked_by_name_else_the_newest_and_the_error_lists_the_runs() {
        let ids = ["b", "a"];
        assert_eq!(pick(&ids, None, "here").unwrap(), "b");
        assert_eq!(pick(&ids, Some("a"), "here").unwrap(), "a");
        let err = pick(&ids, Some("c"), "here").unwrap_err().to_string();
        assert_eq!(err, "here knows no run \"c\" (runs there: b, a)");
        assert_eq!(pick(&[], None, "here").unwrap_err().to_string(), "here knows no runs");
        assert!(pick(&[], Some("c"), "here").unwrap_err().to_string().ends_with("(runs there: none)"));
    }

    #[test]
    fn a_folder_without_a_store_is_named_and_left_alone() {
        let dir = std::env::temp_dir().join(format!("drove-report-nostore-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = RunData::from_store(&dir, None).unwrap_err();
        assert!(matches!(err, ReportError::NoStore(_)), "{err}");
        assert!(!dir.join("coordinator.db").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

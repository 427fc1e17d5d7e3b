//! drove's run store: the SQLite database (WAL) and blob folder in which the
//! coordinator keeps its runs, their members, metric points, events, an
//! elastic run's generations and published weights.
//!
//! It is a crate of its own so that what reads a run's record needs no
//! server: `drove report` and `drove metrics --store` open it read-only
//! beside a live coordinator ([`Store::open_read_only`]; in WAL mode the
//! reader and the writer do not block each other), while the coordinator
//! (`drove-coordinator`) is its one writer. A point is acknowledged only
//! after its batch's transaction commits, so a killed coordinator loses
//! nothing it acknowledged, and a restarted one resumes from here.
//!
//! One file a table family: `runs`, `members` (the workers of a run, and
//! what a restarted coordinator resumes), `points` (metric series and
//! points), `events`, `generations` and `blobs`; beside them the states a
//! run ([`RunState`]) and a generation ([`generation::GenerationState`])
//! move through, stored as their words.
//!
//! ```
//! use drove_store::{Filter, PointRow, RunState, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path())?;
//! store.upsert_run("r", RunState::Running, 1, 1)?;
//! let loss = PointRow { id: 0, run_id: "r".into(), rank: 0, step: 1.0, name: "loss".into(), value: 0.5, wall_ms: 1 };
//! store.insert_points(vec![loss])?;
//!
//! let reader = Store::open_read_only(dir.path())?;
//! let all = Filter { run_id: "r".into(), ..Filter::default() };
//! assert_eq!(reader.points(&all, false)?.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod blobs;
mod events;
pub mod generation;
mod generations;
mod members;
mod points;
pub mod run_state;
mod runs;
mod store;

pub use blobs::BlobRow;
pub use events::EventRow;
pub use members::{LiveRun, MemberRow};
pub use points::{Agg, AggRow, Filter, PointRow};
pub use run_state::RunState;
pub use runs::RunRow;
pub use store::{Store, StoreError, now_ms};

//! The events table: what happened to a run (alarms, re-forms, options).

use std::collections::HashMap;

use rusqlite::params;

use super::{Store, StoreError};

/// Something that happened to a run.
#[derive(Clone, Debug, PartialEq)]
pub struct EventRow {
    /// Run.
    pub run_id: String,
    /// The rank that saw it.
    pub rank: i32,
    /// Step.
    pub step: f64,
    /// Kind, e.g. `diversity_alarm`.
    pub kind: String,
    /// What it means.
    pub message: String,
    /// Unix milliseconds.
    pub wall_ms: i64,
}

impl Store {
    /// Stores an event of a run.
    pub fn add_event(&self, e: &EventRow) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "INSERT INTO events(run_id, rank, step, kind, message, wall_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![e.run_id, e.rank, e.step, e.kind, e.message, e.wall_ms],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Every event, by run, oldest first.
    pub fn events(&self) -> Result<HashMap<String, Vec<EventRow>>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare("SELECT run_id, rank, step, kind, message, wall_ms FROM events ORDER BY id")
            .map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(EventRow {
                    run_id: r.get(0)?,
                    rank: r.get(1)?,
                    step: r.get(2)?,
                    kind: r.get(3)?,
                    message: r.get(4)?,
                    wall_ms: r.get(5)?,
                })
            })
            .map_err(self.sql())?;
        let mut by_run: HashMap<String, Vec<EventRow>> = HashMap::new();
        for row in rows {
            let row = row.map_err(self.sql())?;
            by_run.entry(row.run_id.clone()).or_default().push(row);
        }
        Ok(by_run)
    }
}

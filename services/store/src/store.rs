//! The [`Store`]: its connection, the schema and its migrations.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OpenFlags};

/// A store that cannot be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("store {path}: {source}")]
    Sql {
        /// The database file.
        path: PathBuf,
        /// The cause.
        source: rusqlite::Error,
    },
    /// The file system failed.
    #[error("store {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The connection, and the ids of the (run, metric) series seen so far: points
/// refer to their series by integer, which keeps rows and the index small.
pub struct Db {
    pub(crate) conn: Connection,
    pub(crate) series: HashMap<(String, String), i64>,
}

impl std::ops::Deref for Db {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl std::ops::DerefMut for Db {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

/// The store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Db>>,
    db: PathBuf,
    pub(crate) blobs: PathBuf,
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Store {
    /// Opens (creating if needed) the store in folder `dir`.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StoreError::Io { path, source }
        };
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(io(&blobs))?;
        let db = dir.join("coordinator.db");
        let sql = |source| StoreError::Sql { path: db.clone(), source };
        let conn = Connection::open(&db).map_err(sql)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS runs(
                 run_id TEXT PRIMARY KEY, state TEXT NOT NULL, world_size INTEGER NOT NULL,
                 joined INTEGER NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS series(
                 id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, name TEXT NOT NULL, UNIQUE(run_id, name));
             CREATE TABLE IF NOT EXISTS points(
                 id INTEGER PRIMARY KEY, series INTEGER NOT NULL REFERENCES series(id), rank INTEGER NOT NULL,
                 step REAL NOT NULL, value REAL NOT NULL, wall_ms INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS points_by_series ON points(series, step);
             -- One point per (series, rank, step): a resent point is not stored twice.
             -- Stores from before this index may hold duplicates: keep the first.
             DELETE FROM points WHERE id NOT IN (SELECT MIN(id) FROM points GROUP BY series, rank, step);
             CREATE UNIQUE INDEX IF NOT EXISTS points_once ON points(series, rank, step);
             CREATE TABLE IF NOT EXISTS members(
                 run_id TEXT NOT NULL, rank INTEGER NOT NULL, address TEXT NOT NULL, host TEXT NOT NULL,
                 heartbeat_ms INTEGER NOT NULL, left_run INTEGER NOT NULL DEFAULT 0,
                 error TEXT NOT NULL DEFAULT '', PRIMARY KEY(run_id, rank));
             CREATE TABLE IF NOT EXISTS events(
                 id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, rank INTEGER NOT NULL, step REAL NOT NULL,
                 kind TEXT NOT NULL, message TEXT NOT NULL, wall_ms INTEGER NOT NULL);
             CREATE INDEX IF NOT EXISTS events_by_run ON events(run_id, id);
             CREATE TABLE IF NOT EXISTS generations(
                 run_id TEXT NOT NULL, number INTEGER NOT NULL, state TEXT NOT NULL,
                 min_size INTEGER NOT NULL, max_size INTEGER NOT NULL, world_size INTEGER NOT NULL,
                 members TEXT NOT NULL, first_step INTEGER NOT NULL, last_step INTEGER NOT NULL,
                 lost TEXT NOT NULL, reform TEXT, end_kind TEXT, end_members TEXT, end_detail TEXT,
                 started_ms INTEGER NOT NULL, ended_ms INTEGER NOT NULL, settle_ms INTEGER NOT NULL,
                 PRIMARY KEY(run_id, number));
             CREATE TABLE IF NOT EXISTS blobs(
                 name TEXT PRIMARY KEY, size INTEGER NOT NULL, sha256 TEXT NOT NULL, created_ms INTEGER NOT NULL);",
        )
        .map_err(sql)?;
        // Stores from before restarts were counted lack the column.
        let has_restarts: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'restarts'")
            .and_then(|mut s| s.exists([]))
            .map_err(sql)?;
        if !has_restarts {
            conn.execute_batch("ALTER TABLE runs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0")
                .map_err(sql)?;
        }
        // Leftovers of publishes interrupted by a crash are never visible: remove them.
        if let Ok(entries) = std::fs::read_dir(&blobs) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(".partial-") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(Store { conn: Arc::new(Mutex::new(Db { conn, series: HashMap::new() })), db, blobs })
    }

    /// Opens the store in folder `dir` for reading only: nothing is created,
    /// migrated or written, so a reader (`drove report`) can sit beside the
    /// coordinator that writes it (in WAL mode a reader and the writer do not
    /// block each other). Writes through it fail.
    pub fn open_read_only(dir: &Path) -> Result<Store, StoreError> {
        let db = dir.join("coordinator.db");
        let sql = |source| StoreError::Sql { path: db.clone(), source };
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&db, flags).map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(sql)?;
        let blobs = dir.join("blobs");
        Ok(Store { conn: Arc::new(Mutex::new(Db { conn, series: HashMap::new() })), db, blobs })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Db> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn sql(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sql { path: self.db.clone(), source }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Filter, PointRow, RunState};

    /// A point of run `r`, rank 0, metric `loss`, at `step`.
    pub(crate) fn point(step: f64) -> PointRow {
        PointRow { id: 0, run_id: "r".into(), rank: 0, step, name: "loss".into(), value: step, wall_ms: 1 }
    }

    #[test]
    fn a_read_only_store_sees_the_writer_live_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(Store::open_read_only(&empty).is_err(), "no store there");
        assert!(!empty.join("coordinator.db").exists(), "and none is created");

        let writer = Store::open(dir.path()).unwrap();
        writer.upsert_run("r", RunState::Running, 1, 1).unwrap();
        writer.insert_points(vec![point(1.0)]).unwrap();
        let reader = Store::open_read_only(dir.path()).unwrap();
        let all = Filter { run_id: "r".into(), ..Filter::default() };
        assert_eq!(reader.runs().unwrap()[0].listed_state().word(), "running");
        assert_eq!(reader.points(&all, false).unwrap().len(), 1);
        writer.insert_points(vec![point(2.0)]).unwrap();
        assert_eq!(reader.points(&all, false).unwrap().len(), 2, "the writer's new point, live");
        assert!(
            reader.upsert_run("r", RunState::Finished, 1, 1).is_err(),
            "a write through the reader fails"
        );
        assert!(reader.insert_points(vec![point(3.0)]).is_err());
        assert_eq!(writer.runs().unwrap()[0].listed_state().word(), "running");
    }
}

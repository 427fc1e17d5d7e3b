//! The embedded store: SQLite (WAL) holding runs, blob metadata and metric points,
//! and a folder of blob files. A point is acknowledged only after its batch's
//! transaction commits, so a killed coordinator loses nothing it acknowledged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::generations::{End, Generation, GenerationState};
use crate::run_state::RunState;

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

/// A metric point as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Row id: increases with every point stored.
    pub id: i64,
    /// Run.
    pub run_id: String,
    /// Rank.
    pub rank: i32,
    /// Step.
    pub step: f64,
    /// Name.
    pub name: String,
    /// Value.
    pub value: f64,
    /// Unix milliseconds.
    pub wall_ms: i64,
}

/// A run as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRow {
    /// Run.
    pub run_id: String,
    /// State; none for a run that only recorded points (it never joined
    /// through this coordinator: listed as metrics-only).
    pub state: Option<RunState>,
    /// Expected workers.
    pub world_size: i32,
    /// Joined workers.
    pub joined: i32,
    /// Points stored.
    pub points: u64,
    /// First seen.
    pub created_ms: i64,
    /// Last change.
    pub updated_ms: i64,
    /// Times the world was restarted.
    pub restarts: i32,
}

impl RunRow {
    /// The state as a listing shows it: metrics-only for a run that only
    /// recorded points.
    pub fn listed_state(&self) -> drove_proto::v1::RunState {
        self.state.map_or(drove_proto::v1::RunState::MetricsOnly, drove_proto::v1::RunState::from)
    }
}

/// A run's state is stored as its word (`running`, ...), so the rows of a
/// store written before the state was a type read the same.
impl ToSql for RunState {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

/// A stored word that is no state is an error naming it.
impl FromSql for RunState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        value.as_str()?.parse().map_err(|e| FromSqlError::Other(Box::new(e)))
    }
}

/// A worker of a run as stored: who it is, when it was last heard of, and
/// whether (and how) it left.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberRow {
    /// Its rank.
    pub rank: i32,
    /// Its data-plane address.
    pub address: String,
    /// Its host.
    pub host: String,
    /// Its last join or heartbeat, Unix milliseconds.
    pub heartbeat_ms: i64,
    /// Whether it has left.
    pub left: bool,
    /// Why it failed (empty: it did not).
    pub error: String,
}

/// A run that has not ended, with its workers: what a restarted coordinator
/// resumes.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveRun {
    /// Run.
    pub run_id: String,
    /// Rendezvous or running.
    pub state: RunState,
    /// Expected workers.
    pub world_size: i32,
    /// The workers that joined.
    pub members: Vec<MemberRow>,
}

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

/// A blob's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct BlobRow {
    /// Name.
    pub name: String,
    /// Size.
    pub size: u64,
    /// sha256 hex.
    pub sha256: String,
    /// Unix milliseconds.
    pub created_ms: i64,
}

/// How to filter points.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Run.
    pub run_id: String,
    /// Metric name, if only one.
    pub name: Option<String>,
    /// Lowest step.
    pub min_step: Option<f64>,
    /// Highest step.
    pub max_step: Option<f64>,
    /// Only points with a larger id.
    pub after_id: Option<i64>,
}

/// Aggregation across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agg {
    /// Mean.
    Mean,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum.
    Sum,
    /// Count.
    Count,
}

/// One aggregated row.
#[derive(Clone, Debug, PartialEq)]
pub struct AggRow {
    /// Name.
    pub name: String,
    /// Step.
    pub step: f64,
    /// Aggregate.
    pub value: f64,
    /// Points aggregated.
    pub count: u32,
    /// Latest wall time.
    pub wall_ms: i64,
}

/// The connection, and the ids of the (run, metric) series seen so far: points
/// refer to their series by integer, which keeps rows and the index small.
pub struct Db {
    conn: Connection,
    series: HashMap<(String, String), i64>,
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
    blobs: PathBuf,
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

    fn lock(&self) -> MutexGuard<'_, Db> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sql(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sql { path: self.db.clone(), source }
    }

    /// The folder of blob files.
    pub fn blob_dir(&self) -> &Path {
        &self.blobs
    }

    /// Where a blob's bytes live: a name-derived file name, so any blob name is safe.
    pub fn blob_path(&self, name: &str) -> PathBuf {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(name.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        self.blobs.join(hex)
    }

    /// Records or updates a run.
    pub fn upsert_run(
        &self,
        run_id: &str,
        state: RunState,
        world_size: i32,
        joined: i32,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        self.lock()
            .execute(
                "INSERT INTO runs(run_id, state, world_size, joined, created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?5)
                 ON CONFLICT(run_id) DO UPDATE SET state = ?2, world_size = ?3, joined = ?4, updated_ms = ?5",
                params![run_id, state, world_size, joined, now],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Stores a batch of points in one transaction; returns those stored, with
    /// their ids (a point whose run, rank, name and step the store holds
    /// already is left out: it is not stored twice).
    pub fn insert_points(&self, points: Vec<Point>) -> Result<Vec<Point>, StoreError> {
        self.insert_points_then(points, |_| {})
    }

    /// As [`Store::insert_points`], calling `committed` before other writers may
    /// commit, so that what it publishes is in id order.
    pub fn insert_points_then(
        &self,
        points: Vec<Point>,
        committed: impl FnOnce(&[Point]),
    ) -> Result<Vec<Point>, StoreError> {
        const ROWS: usize = 64; // rows per INSERT statement: far fewer statement steps
        let mut guard = self.lock();
        let db = &mut *guard;
        let tx = db.conn.transaction().map_err(self.sql())?;
        let out = points;
        // Series ids, created on first sight.
        let mut ids = Vec::with_capacity(out.len());
        for p in &out {
            let key = (p.run_id.clone(), p.name.clone());
            let id = match db.series.get(&key) {
                Some(&id) => id,
                None => {
                    tx.execute(
                        "INSERT OR IGNORE INTO series(run_id, name) VALUES (?1, ?2)",
                        params![key.0, key.1],
                    )
                    .map_err(self.sql())?;
                    let id: i64 = tx
                        .query_row(
                            "SELECT id FROM series WHERE run_id = ?1 AND name = ?2",
                            params![key.0, key.1],
                            |r| r.get(0),
                        )
                        .map_err(self.sql())?;
                    db.series.insert(key, id);
                    id
                }
            };
            ids.push(id);
        }
        // Rows that a point of the same (series, rank, step) holds already are
        // skipped; RETURNING names the rows inserted.
        let mut inserted: HashMap<(i64, i32, u64), i64> = HashMap::with_capacity(out.len());
        {
            let sql = |n: usize| {
                let values = vec!["(?, ?, ?, ?, ?)"; n].join(", ");
                format!(
                    "INSERT INTO points(series, rank, step, value, wall_ms) VALUES {values}
                     ON CONFLICT(series, rank, step) DO NOTHING RETURNING id, series, rank, step"
                )
            };
            let mut start = 0;
            while start < out.len() {
                let n = (out.len() - start).min(ROWS);
                let rows = &out[start..start + n];
                let args = rows.iter().zip(&ids[start..start + n]).flat_map(
                    |(p, id)| -> [&dyn rusqlite::ToSql; 5] { [id, &p.rank, &p.step, &p.value, &p.wall_ms] },
                );
                let mut stmt = tx.prepare_cached(&sql(n)).map_err(self.sql())?;
                let mut returned = stmt.query(rusqlite::params_from_iter(args)).map_err(self.sql())?;
                while let Some(row) = returned.next().map_err(self.sql())? {
                    let (id, series, rank, step): (i64, i64, i32, f64) = (
                        row.get(0).map_err(self.sql())?,
                        row.get(1).map_err(self.sql())?,
                        row.get(2).map_err(self.sql())?,
                        row.get(3).map_err(self.sql())?,
                    );
                    inserted.insert((series, rank, step.to_bits()), id);
                }
                start += n;
            }
        }
        // The points inserted, with their ids, in id order; the first of
        // several equal points in one batch is the one stored.
        let mut out: Vec<Point> = out
            .into_iter()
            .zip(ids)
            .filter_map(|(mut p, series)| {
                p.id = inserted.remove(&(series, p.rank, p.step.to_bits()))?;
                Some(p)
            })
            .collect();
        out.sort_unstable_by_key(|p| p.id);
        tx.commit().map_err(self.sql())?;
        committed(&out);
        Ok(out)
    }

    fn where_clause(f: &Filter) -> (String, Vec<rusqlite::types::Value>) {
        use rusqlite::types::Value;
        let mut sql = String::from(" WHERE s.run_id = ?");
        let mut args = vec![Value::Text(f.run_id.clone())];
        if let Some(n) = &f.name {
            sql.push_str(" AND s.name = ?");
            args.push(Value::Text(n.clone()));
        }
        if let Some(s) = f.min_step {
            sql.push_str(" AND p.step >= ?");
            args.push(Value::Real(s));
        }
        if let Some(s) = f.max_step {
            sql.push_str(" AND p.step <= ?");
            args.push(Value::Real(s));
        }
        if let Some(id) = f.after_id {
            sql.push_str(" AND p.id > ?");
            args.push(Value::Integer(id));
        }
        (sql, args)
    }

    /// Raw points, ordered by id when `by_id`, else by name, step, rank.
    pub fn points(&self, f: &Filter, by_id: bool) -> Result<Vec<Point>, StoreError> {
        let (clause, args) = Self::where_clause(f);
        let order = if by_id { " ORDER BY p.id" } else { " ORDER BY s.name, p.step, p.rank, p.id" };
        let conn = self.lock();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT p.id, s.run_id, p.rank, p.step, s.name, p.value, p.wall_ms
                   FROM points p JOIN series s ON s.id = p.series{clause}{order}"
            ))
            .map_err(self.sql())?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| {
                Ok(Point {
                    id: r.get(0)?,
                    run_id: r.get(1)?,
                    rank: r.get(2)?,
                    step: r.get(3)?,
                    name: r.get(4)?,
                    value: r.get(5)?,
                    wall_ms: r.get(6)?,
                })
            })
            .map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// Points aggregated across ranks per (name, step).
    pub fn aggregate(&self, f: &Filter, agg: Agg) -> Result<Vec<AggRow>, StoreError> {
        let func = match agg {
            Agg::Mean => "AVG(p.value)",
            Agg::Min => "MIN(p.value)",
            Agg::Max => "MAX(p.value)",
            Agg::Sum => "SUM(p.value)",
            Agg::Count => "COUNT(*)",
        };
        let (clause, args) = Self::where_clause(f);
        let conn = self.lock();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT s.name, p.step, {func}, COUNT(*), MAX(p.wall_ms) FROM points p JOIN series s ON s.id = p.series{clause}
                  GROUP BY s.name, p.step ORDER BY s.name, p.step"
            ))
            .map_err(self.sql())?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(args), |r| {
                Ok(AggRow {
                    name: r.get(0)?,
                    step: r.get(1)?,
                    value: r.get(2)?,
                    count: r.get(3)?,
                    wall_ms: r.get(4)?,
                })
            })
            .map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// The largest point id so far (0 if none).
    pub fn max_point_id(&self) -> Result<i64, StoreError> {
        self.lock().query_row("SELECT COALESCE(MAX(id), 0) FROM points", [], |r| r.get(0)).map_err(self.sql())
    }

    /// Records that the world of `run_id` has been restarted `count` times (the
    /// highest count seen stays).
    pub fn record_restarts(&self, run_id: &str, count: i32) -> Result<(), StoreError> {
        self.lock()
            .execute("UPDATE runs SET restarts = MAX(restarts, ?2) WHERE run_id = ?1", params![run_id, count])
            .map_err(self.sql())?;
        Ok(())
    }

    /// The latest value of every metric of every rank of the running runs:
    /// (run, rank, name, value).
    pub fn latest_of_running(&self) -> Result<Vec<(String, i32, String, f64)>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(
                "SELECT s.run_id, p.rank, s.name, p.value FROM points p JOIN series s ON s.id = p.series
                  WHERE s.run_id IN (SELECT run_id FROM runs WHERE state = ?1)
                    AND p.id IN (SELECT MAX(q.id) FROM points q JOIN series t ON t.id = q.series
                                  WHERE t.run_id IN (SELECT run_id FROM runs WHERE state = ?1)
                                  GROUP BY q.series, q.rank)
                  ORDER BY s.run_id, p.rank, s.name",
            )
            .map_err(self.sql())?;
        let rows = stmt
            .query_map([RunState::Running], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

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

    /// Records that `rank` joined `run_id` (replacing an earlier worker of that rank).
    pub fn put_member(&self, run_id: &str, rank: i32, address: &str, host: &str) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "INSERT OR REPLACE INTO members(run_id, rank, address, host, heartbeat_ms, left_run, error)
                 VALUES (?1, ?2, ?3, ?4, ?5, 0, '')",
                params![run_id, rank, address, host, now_ms()],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Forgets `rank` of `run_id` (a join that timed out), or every worker of
    /// the run when `rank` is `None` (a run id starting over).
    pub fn remove_members(&self, run_id: &str, rank: Option<i32>) -> Result<(), StoreError> {
        let conn = self.lock();
        match rank {
            Some(r) => {
                conn.execute("DELETE FROM members WHERE run_id = ?1 AND rank = ?2", params![run_id, r])
            }
            None => conn.execute("DELETE FROM members WHERE run_id = ?1", params![run_id]),
        }
        .map_err(self.sql())?;
        Ok(())
    }

    /// Records a heartbeat of `rank` of `run_id` at `at_ms`.
    pub fn heartbeat(&self, run_id: &str, rank: i32, at_ms: i64) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "UPDATE members SET heartbeat_ms = ?3 WHERE run_id = ?1 AND rank = ?2",
                params![run_id, rank, at_ms],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Records that `rank` of `run_id` left, with `error` if it failed.
    pub fn member_left(&self, run_id: &str, rank: i32, error: &str) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "UPDATE members SET left_run = 1, error = ?3 WHERE run_id = ?1 AND rank = ?2",
                params![run_id, rank, error],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// The runs that have not ended (`rendezvous` or `running`), with their workers.
    pub fn live_runs(&self) -> Result<Vec<LiveRun>, StoreError> {
        let conn = self.lock();
        let mut runs: Vec<LiveRun> = conn
            .prepare("SELECT run_id, state, world_size FROM runs WHERE state IN (?1, ?2)")
            .map_err(self.sql())?
            .query_map([RunState::Rendezvous, RunState::Running], |r| {
                Ok(LiveRun {
                    run_id: r.get(0)?,
                    state: r.get(1)?,
                    world_size: r.get(2)?,
                    members: Vec::new(),
                })
            })
            .map_err(self.sql())?
            .collect::<Result<_, _>>()
            .map_err(self.sql())?;
        let mut stmt = conn
            .prepare(
                "SELECT rank, address, host, heartbeat_ms, left_run, error FROM members
                  WHERE run_id = ?1 ORDER BY rank",
            )
            .map_err(self.sql())?;
        for run in &mut runs {
            run.members = stmt
                .query_map([&run.run_id], |r| {
                    Ok(MemberRow {
                        rank: r.get(0)?,
                        address: r.get(1)?,
                        host: r.get(2)?,
                        heartbeat_ms: r.get(3)?,
                        left: r.get::<_, i64>(4)? != 0,
                        error: r.get(5)?,
                    })
                })
                .map_err(self.sql())?
                .collect::<Result<_, _>>()
                .map_err(self.sql())?;
        }
        Ok(runs)
    }

    /// Records generation `g` of elastic run `run_id` (sized `min..=max`),
    /// replacing what was stored of it.
    pub fn put_generation(
        &self,
        run_id: &str,
        min: usize,
        max: usize,
        g: &Generation,
    ) -> Result<(), StoreError> {
        let end = g.end.as_ref();
        self.lock()
            .execute(
                "INSERT OR REPLACE INTO generations(run_id, number, state, min_size, max_size, world_size, members,
                     first_step, last_step, lost, reform, end_kind, end_members, end_detail, started_ms, ended_ms, settle_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
                params![
                    run_id,
                    g.number,
                    g.state.as_str(),
                    min as i64,
                    max as i64,
                    if g.has_run() { g.world_size() as i64 } else { 0 },
                    to_json(&g.members),
                    g.first_step,
                    g.last_step,
                    to_json(&g.lost.iter().collect::<Vec<_>>()),
                    g.reform.as_ref().map(|e| to_json(&StoredEnd::from(e))),
                    end.map(|e| e.kind.as_str_name()),
                    end.map(|e| to_json(&e.members)),
                    end.map(|e| e.detail.as_str()),
                    g.started_ms,
                    g.ended_ms,
                    g.settle.as_millis() as i64,
                ],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// The generations of elastic run `run_id`, oldest first, with the
    /// run's sizes `(min, max)` (none if it has no generation stored).
    pub fn generations(&self, run_id: &str) -> Result<Option<(usize, usize, Vec<Generation>)>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(
                "SELECT number, state, min_size, max_size, members, first_step, last_step, lost, reform,
                        end_kind, end_members, end_detail, started_ms, ended_ms, settle_ms
                   FROM generations WHERE run_id = ?1 ORDER BY number",
            )
            .map_err(self.sql())?;
        let rows = stmt.query_map([run_id], generation_row).map_err(self.sql())?;
        let rows: Vec<(usize, usize, Generation)> = rows.collect::<Result<_, _>>().map_err(self.sql())?;
        let Some(&(min, max, _)) = rows.last() else { return Ok(None) };
        Ok(Some((min, max, rows.into_iter().map(|(_, _, g)| g).collect())))
    }

    /// Forgets the generations of `run_id` (its id starts over).
    pub fn remove_generations(&self, run_id: &str) -> Result<(), StoreError> {
        self.lock().execute("DELETE FROM generations WHERE run_id = ?1", [run_id]).map_err(self.sql())?;
        Ok(())
    }

    /// Whether the store has run `run_id` (it joined, or recorded points).
    pub fn has_run(&self, run_id: &str) -> Result<bool, StoreError> {
        self.lock()
            .query_row(
                "SELECT EXISTS(SELECT 1 FROM runs WHERE run_id = ?1) OR EXISTS(SELECT 1 FROM series WHERE run_id = ?1)",
                [run_id],
                |r| r.get(0),
            )
            .map_err(self.sql())
    }

    /// Every run: those that joined, and those that only recorded points.
    pub fn runs(&self) -> Result<Vec<RunRow>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(
                "WITH per_run AS (
                     SELECT s.run_id, COUNT(*) n, MIN(p.wall_ms) first, MAX(p.wall_ms) last
                       FROM points p JOIN series s ON s.id = p.series GROUP BY s.run_id)
                 SELECT r.run_id, r.state, r.world_size, r.joined, COALESCE(p.n, 0), r.created_ms,
                        MAX(r.updated_ms, COALESCE(p.last, 0)), r.restarts
                   FROM runs r LEFT JOIN per_run p ON p.run_id = r.run_id
                 UNION ALL
                 SELECT run_id, NULL, 0, 0, n, first, last, 0 FROM per_run
                  WHERE run_id NOT IN (SELECT run_id FROM runs)
                 ORDER BY 6 DESC",
            )
            .map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(RunRow {
                    run_id: r.get(0)?,
                    state: r.get(1)?,
                    world_size: r.get(2)?,
                    joined: r.get(3)?,
                    points: r.get::<_, i64>(4)? as u64,
                    created_ms: r.get(5)?,
                    updated_ms: r.get(6)?,
                    restarts: r.get(7)?,
                })
            })
            .map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// Records a published blob (its file is already in place).
    pub fn put_blob(&self, b: &BlobRow) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "INSERT OR REPLACE INTO blobs(name, size, sha256, created_ms) VALUES (?1, ?2, ?3, ?4)",
                params![b.name, b.size as i64, b.sha256, b.created_ms],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// A blob's metadata.
    pub fn blob(&self, name: &str) -> Result<Option<BlobRow>, StoreError> {
        self.lock()
            .query_row("SELECT name, size, sha256, created_ms FROM blobs WHERE name = ?1", [name], |r| {
                Ok(BlobRow {
                    name: r.get(0)?,
                    size: r.get::<_, i64>(1)? as u64,
                    sha256: r.get(2)?,
                    created_ms: r.get(3)?,
                })
            })
            .optional()
            .map_err(self.sql())
    }

    /// Every blob.
    pub fn blobs(&self) -> Result<Vec<BlobRow>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare("SELECT name, size, sha256, created_ms FROM blobs ORDER BY name")
            .map_err(self.sql())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(BlobRow {
                    name: r.get(0)?,
                    size: r.get::<_, i64>(1)? as u64,
                    sha256: r.get(2)?,
                    created_ms: r.get(3)?,
                })
            })
            .map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }
}

/// A generation's end as its stored JSON (`reform`): the kind by its proto name.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredEnd {
    kind: String,
    members: Vec<String>,
    detail: String,
}

impl From<&End> for StoredEnd {
    fn from(e: &End) -> StoredEnd {
        StoredEnd {
            kind: e.kind.as_str_name().to_string(),
            members: e.members.clone(),
            detail: e.detail.clone(),
        }
    }
}

/// A stored end kind's name that is no kind is an error naming it.
fn end_kind(name: &str, column: usize) -> rusqlite::Result<drove_proto::v1::EndKind> {
    drove_proto::v1::EndKind::from_str_name(name).ok_or_else(|| {
        let e = format!("{name:?} is not an end kind (END_KIND_...)");
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e.into())
    })
}

/// Reads JSON column `column`, a failure naming it.
fn from_json<T: serde::de::DeserializeOwned>(text: &str, column: usize) -> rusqlite::Result<T> {
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// A JSON column's text.
fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("plain data serialises")
}

/// One row of the generations table: the run's sizes and the generation.
fn generation_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(usize, usize, Generation)> {
    let state: String = r.get(1)?;
    let state: GenerationState =
        state.parse().map_err(|e: crate::generations::ParseGenerationStateError| {
            rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e))
        })?;
    let reform: Option<String> = r.get(8)?;
    let reform = match reform {
        Some(text) => {
            let e: StoredEnd = from_json(&text, 8)?;
            Some(End { kind: end_kind(&e.kind, 8)?, members: e.members, detail: e.detail })
        }
        None => None,
    };
    let end_name: Option<String> = r.get(9)?;
    let end = match end_name {
        Some(name) => Some(End {
            kind: end_kind(&name, 9)?,
            members: from_json(&r.get::<_, String>(10)?, 10)?,
            detail: r.get(11)?,
        }),
        None => None,
    };
    let generation = Generation {
        number: r.get(0)?,
        state,
        members: from_json(&r.get::<_, String>(4)?, 4)?,
        first_step: r.get(5)?,
        last_step: r.get(6)?,
        lost: from_json::<Vec<String>>(&r.get::<_, String>(7)?, 7)?.into_iter().collect(),
        reform,
        end,
        started_ms: r.get(12)?,
        ended_ms: r.get(13)?,
        settle: std::time::Duration::from_millis(r.get::<_, i64>(14)?.max(0) as u64),
        last_join: std::time::Instant::now(),
    };
    Ok((r.get::<_, i64>(2)? as usize, r.get::<_, i64>(3)? as usize, generation))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(step: f64) -> Point {
        Point { id: 0, run_id: "r".into(), rank: 0, step, name: "loss".into(), value: step, wall_ms: 1 }
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

    fn put_run_row(store: &Store, run_id: &str, state: &str) {
        store
            .lock()
            .execute(
                "INSERT INTO runs(run_id, state, world_size, joined, created_ms, updated_ms) VALUES (?1, ?2, 2, 2, 1, 1)",
                params![run_id, state],
            )
            .unwrap();
    }

    #[test]
    fn generations_read_back_as_stored_and_start_over_with_their_run() {
        use crate::generations::{Elastic, ElasticJoin};
        use drove_proto::v1::EndKind;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.generations("e").unwrap(), None);
        let t0 = std::time::Instant::now();
        let mut run = Elastic::new("e", 1, 2);
        let join = |id: &str, after: i64, cause: End| ElasticJoin {
            member_id: id.into(),
            address: format!("{id}:1"),
            host: "h".into(),
            min: 1,
            max: 2,
            after,
            settle: std::time::Duration::from_millis(5),
            step: 3,
            cause,
        };
        let none = End::of(EndKind::Unspecified, &[]);
        run.join(&join("a", 0, none.clone()), t0, 1).unwrap();
        run.join(&join("b", 0, none), t0, 1).unwrap();
        assert!(run.try_close(t0, 2));
        let lost = End { detail: "closed".into(), ..End::of(EndKind::ClosedConnection, &["b"]) };
        run.join(&join("a", 1, lost), t0, 3).unwrap();
        for g in run.take_changed() {
            store.put_generation("e", 1, 2, g).unwrap();
        }
        let (min, max, stored) = store.generations("e").unwrap().unwrap();
        assert_eq!((min, max, stored.len()), (1, 2, 2));
        for (got, want) in stored.iter().zip(&run.generations) {
            assert_eq!(&Generation { last_join: want.last_join, ..got.clone() }, want);
        }
        assert!(store.has_run("e").is_ok_and(|has| !has), "no runs row was written here");
        store.remove_generations("e").unwrap();
        assert_eq!(store.generations("e").unwrap(), None);
    }

    #[test]
    fn states_stored_as_words_read_back_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // Rows as the coordinator wrote them when the state was a string.
        for (run_id, word) in [("a", "rendezvous"), ("b", "running"), ("c", "finished"), ("d", "failed")] {
            put_run_row(&store, run_id, word);
        }
        store.insert_points(vec![Point { run_id: "m".into(), ..point(1.0) }]).unwrap();
        let mut listed: Vec<(String, Option<RunState>, &str)> = store
            .runs()
            .unwrap()
            .into_iter()
            .map(|r| (r.run_id.clone(), r.state, r.listed_state().word()))
            .collect();
        listed.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            listed,
            [
                ("a".into(), Some(RunState::Rendezvous), "rendezvous"),
                ("b".into(), Some(RunState::Running), "running"),
                ("c".into(), Some(RunState::Finished), "finished"),
                ("d".into(), Some(RunState::Failed), "failed"),
                ("m".into(), None, "metrics-only"),
            ]
        );
        let mut live: Vec<(String, RunState)> =
            store.live_runs().unwrap().into_iter().map(|r| (r.run_id, r.state)).collect();
        live.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(live, [("a".into(), RunState::Rendezvous), ("b".into(), RunState::Running)]);
        store.upsert_run("c", RunState::Running, 2, 2).unwrap();
        let stored: String =
            store.lock().query_row("SELECT state FROM runs WHERE run_id = 'c'", [], |r| r.get(0)).unwrap();
        assert_eq!(stored, "running", "written as its word");

        put_run_row(&store, "bad", "paused");
        let err = store.runs().unwrap_err().to_string();
        assert!(err.contains("\"paused\" is not a run state"), "{err}");
    }
}

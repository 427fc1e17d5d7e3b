//! The runs table: a run's state, world, joins and restarts, and the
//! listing of every run (those that only recorded points too).

use rusqlite::params;
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

use super::{Store, StoreError, now_ms};
use crate::RunState;

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

impl Store {
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

    /// Records that the world of `run_id` has been restarted `count` times (the
    /// highest count seen stays).
    pub fn record_restarts(&self, run_id: &str, count: i32) -> Result<(), StoreError> {
        self.lock()
            .execute("UPDATE runs SET restarts = MAX(restarts, ?2) WHERE run_id = ?1", params![run_id, count])
            .map_err(self.sql())?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PointRow;
    use crate::store::tests::point;

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
    fn states_stored_as_words_read_back_and_a_bad_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // Rows as the coordinator wrote them when the state was a string.
        for (run_id, word) in [("a", "rendezvous"), ("b", "running"), ("c", "finished"), ("d", "failed")] {
            put_run_row(&store, run_id, word);
        }
        store.insert_points(vec![PointRow { run_id: "m".into(), ..point(1.0) }]).unwrap();
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

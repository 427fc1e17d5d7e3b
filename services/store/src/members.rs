//! The members table: the workers of a run, their heartbeats and leaves,
//! and the runs a restarted coordinator resumes.

use rusqlite::params;

use super::{Store, StoreError, now_ms};
use crate::RunState;

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

impl Store {
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
}

//! The metric points: a series per (run, metric), and its points, stored in
//! batches, read raw or aggregated across ranks.

use std::collections::HashMap;

use rusqlite::params;

use super::{Store, StoreError};
use crate::RunState;

/// A metric point as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct PointRow {
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

impl Store {
    /// Stores a batch of points in one transaction; returns those stored, with
    /// their ids (a point whose run, rank, name and step the store holds
    /// already is left out: it is not stored twice).
    pub fn insert_points(&self, points: Vec<PointRow>) -> Result<Vec<PointRow>, StoreError> {
        self.insert_points_then(points, |_| {})
    }

    /// As [`Store::insert_points`], calling `committed` before other writers may
    /// commit, so that what it publishes is in id order.
    pub fn insert_points_then(
        &self,
        points: Vec<PointRow>,
        committed: impl FnOnce(&[PointRow]),
    ) -> Result<Vec<PointRow>, StoreError> {
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
        let mut out: Vec<PointRow> = out
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
    pub fn points(&self, f: &Filter, by_id: bool) -> Result<Vec<PointRow>, StoreError> {
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
                Ok(PointRow {
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
}

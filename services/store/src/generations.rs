//! The generations table: the worlds of an elastic run, a row each, its
//! members and ends as JSON.

use rusqlite::params;

use super::{Store, StoreError};
use crate::generation::{Generation, GenerationEnding, GenerationState};

impl Store {
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
}

/// A generation's end as its stored JSON (`reform`): the kind by its proto name.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredEnd {
    kind: String,
    members: Vec<String>,
    detail: String,
}

impl From<&GenerationEnding> for StoredEnd {
    fn from(e: &GenerationEnding) -> StoredEnd {
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
        state.parse().map_err(|e: crate::generation::ParseGenerationStateError| {
            rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, Box::new(e))
        })?;
    let reform: Option<String> = r.get(8)?;
    let reform = match reform {
        Some(text) => {
            let e: StoredEnd = from_json(&text, 8)?;
            Some(GenerationEnding { kind: end_kind(&e.kind, 8)?, members: e.members, detail: e.detail })
        }
        None => None,
    };
    let end_name: Option<String> = r.get(9)?;
    let end = match end_name {
        Some(name) => Some(GenerationEnding {
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

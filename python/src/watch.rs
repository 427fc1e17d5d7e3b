//! drove-watch's comparison for `python -m drove.watch`: the notes every
//! rank's watcher sent, gathered by the program's own process group, compared
//! by the same code as `drove run`'s launcher, in the same words.

use drove_watch::{Note, NoteComparer as Inner, WatchSummary};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Compares the watcher's notes across ranks and workers.
#[pyclass(module = "drove")]
pub(crate) struct NoteComparer {
    inner: Inner,
    summary: WatchSummary,
}

#[pymethods]
impl NoteComparer {
    /// For a world of `world_size` ranks.
    #[new]
    fn new(world_size: usize) -> PyResult<Self> {
        if world_size == 0 {
            return Err(PyValueError::new_err("world_size must be at least 1"));
        }
        Ok(NoteComparer { inner: Inner::new(world_size), summary: WatchSummary::default() })
    }

    /// Adds one note (a datagram the watcher sent); returns the alarms it
    /// completes, each as the line `drove run` prints after
    /// `drove-watch: diversity alarm: `. A note that is not the watcher's is
    /// a ValueError naming what is wrong.
    fn add(&mut self, note: &[u8]) -> PyResult<Vec<String>> {
        let note = Note::parse(note).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let done = self.inner.add(note);
        self.summary.count(&done);
        Ok(done.alarms.iter().map(|(finding, fix)| format!("{finding}. Fix: {fix}")).collect())
    }

    /// The end: the summary line, every stream alarm in full, the warnings.
    fn finish(&mut self) -> (String, Vec<String>, Vec<String>) {
        self.summary.close(&self.inner);
        let text = |f: &drove_watch::Finding| f.to_string();
        (
            self.summary.describe(),
            self.summary.alarmed.iter().map(text).collect(),
            self.summary.warnings.iter().map(text).collect(),
        )
    }
}

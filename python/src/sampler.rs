//! drove-collate's distributed sampler for Python: the epoch's order fixed by
//! (seed, epoch) through drove-seed's shuffle stream, the same on every rank
//! and in Rust, sharded by stride and padded (or truncated) to equal shards.

use drove_collate::{DistributedSampler as Inner, Remainder, SamplerOptions};
use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Mutex;

/// One rank's shard of a dataset of `len` samples, in drove's order.
#[pyclass(module = "drove")]
pub(crate) struct Sampler(Mutex<Inner>);

#[pymethods]
impl Sampler {
    #[new]
    #[pyo3(signature = (len, *, world_size, rank, seed = 0, shuffle = true, drop_last = false))]
    fn new(
        len: usize,
        world_size: usize,
        rank: usize,
        seed: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> PyResult<Self> {
        let remainder = if drop_last { Remainder::Drop } else { Remainder::Pad };
        let inner =
            Inner::new(len, SamplerOptions { world_size, rank, seed, shuffle, remainder }).map_err(|e| {
                let argument = if world_size == 0 { "world_size" } else { "rank" };
                PyValueError::new_err(format!("{argument}: {e}"))
            })?;
        Ok(Sampler(Mutex::new(inner)))
    }

    /// Sets the epoch: the order changes with it, identically on every rank.
    fn set_epoch(&self, epoch: u64) {
        self.lock().set_epoch(epoch);
    }

    /// The current epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.lock().epoch()
    }

    /// Samples every rank gets this epoch.
    fn __len__(&self) -> usize {
        self.lock().shard_len()
    }

    /// This rank's sample indices for the current epoch, as int64.
    fn indices<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let indices = self.lock().indices();
        PyArray1::from_vec(py, indices.into_iter().map(|i| i as i64).collect())
    }

    /// The whole world's order for the current epoch (every rank's, interleaved).
    fn global_order<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i64>> {
        let order = self.lock().global_order();
        PyArray1::from_vec(py, order.into_iter().map(|i| i as i64).collect())
    }
}

impl Sampler {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

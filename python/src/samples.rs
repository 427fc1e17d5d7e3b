//! drove-seed's per-sample streams for Python: one family per (seed,
//! purpose, epoch), and in it one ChaCha8 stream per global sample index, so
//! a sample draws the same numbers whatever worker or rank handles it.

use drove_seed::{Purpose, SampleStreams as Inner};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::streams::{StreamKey, logged_seed};

/// The per-sample streams of (`seed`, `purpose`, `epoch`): `outputs(sample)`
/// is sample `sample`'s stream, as `drove seed --sample` prints it.
#[pyclass(module = "drove", frozen)]
pub(crate) struct SampleStreams(Inner);

fn purpose_of(purpose: &str) -> PyResult<Purpose> {
    match purpose {
        "shuffle" => Ok(Purpose::Shuffle),
        "augment" => Ok(Purpose::Augment),
        "init" => Ok(Purpose::Init),
        "dropout" => Ok(Purpose::Dropout),
        other => Err(PyValueError::new_err(format!(
            "purpose: unknown purpose {other:?} for per-sample streams (expected shuffle, augment, init or dropout)"
        ))),
    }
}

fn chacha_outputs(mut rng: impl drove_seed::rand_core::Rng, n: usize) -> Vec<u64> {
    (0..n).map(|_| rng.next_u64()).collect()
}

#[pymethods]
impl SampleStreams {
    #[new]
    #[pyo3(signature = (*, seed, purpose = "augment", epoch = 0))]
    fn new(seed: u64, purpose: &str, epoch: u64) -> PyResult<Self> {
        Ok(SampleStreams(Inner::new(seed, purpose_of(purpose)?, epoch)))
    }

    /// The family's key.
    #[getter]
    fn key(&self) -> StreamKey {
        StreamKey::from(self.0.key())
    }

    /// The family's derived seed (64 hex digits): log it, and
    /// `replay_sample_outputs` replays any sample's stream from it.
    fn derived_seed(&self) -> String {
        self.0.derived().to_string()
    }

    /// The first `n` 64-bit outputs of sample `sample`'s stream.
    #[pyo3(signature = (sample, n = 4))]
    fn outputs(&self, sample: u64, n: usize) -> Vec<u64> {
        chacha_outputs(self.0.stream(sample), n)
    }

    fn __repr__(&self) -> String {
        format!("SampleStreams({})", self.0.key())
    }
}

/// The first `n` outputs of sample `sample`'s stream in the family whose
/// derived seed (64 hex digits) was logged.
#[pyfunction]
#[pyo3(signature = (derived_seed, sample, n = 4))]
pub(crate) fn replay_sample_outputs(
    derived_seed: &Bound<'_, PyAny>,
    sample: u64,
    n: usize,
) -> PyResult<Vec<u64>> {
    Ok(chacha_outputs(Inner::from_derived(logged_seed(derived_seed)?).stream(sample), n))
}

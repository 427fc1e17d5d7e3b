//! drove-seed's stream keys for Python.
//!
//! A key names one random stream (purpose, base seed, rank, loader worker,
//! epoch, lane) and hashes into 256 bits of generator state exactly as the
//! Rust crates and `drove seed` do, so a Python program and a Rust one that
//! name the same key draw the same numbers.

use drove_seed::{AugmentKey, DerivedSeed, DropoutKey, ShuffleKey, StreamKey as Key};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A random stream's whole key (see drove-seed): build it with one of the
/// purpose constructors, e.g. `StreamKey.augment(seed=42, rank=1, worker=2, epoch=3)`.
#[pyclass(module = "drove", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct StreamKey(Key);

impl From<Key> for StreamKey {
    fn from(key: Key) -> Self {
        StreamKey(key)
    }
}

fn u32_arg(name: &str, value: u64) -> PyResult<u32> {
    u32::try_from(value)
        .map_err(|_| PyValueError::new_err(format!("{name} must be below 2**32, got {value}")))
}

#[pymethods]
impl StreamKey {
    /// The sampler order of `epoch`: the same on every rank.
    #[staticmethod]
    #[pyo3(signature = (*, seed, epoch = 0))]
    fn shuffle(seed: u64, epoch: u64) -> Self {
        StreamKey(Key::shuffle(ShuffleKey { seed, epoch }))
    }

    /// Augmentation (masking): distinct per rank, loader worker and epoch.
    #[staticmethod]
    #[pyo3(signature = (*, seed, rank, worker = 0, epoch = 0))]
    fn augment(seed: u64, rank: u64, worker: u64, epoch: u64) -> PyResult<Self> {
        Ok(StreamKey(Key::augment(AugmentKey {
            seed,
            rank: u32_arg("rank", rank)?,
            worker: u32_arg("worker", worker)?,
            epoch,
        })))
    }

    /// Weight initialisation: the same on every rank.
    #[staticmethod]
    #[pyo3(signature = (*, seed))]
    fn init(seed: u64) -> Self {
        StreamKey(Key::init(seed))
    }

    /// Dropout: distinct per rank and optimizer step.
    #[staticmethod]
    #[pyo3(signature = (*, seed, rank, step = 0))]
    fn dropout(seed: u64, rank: u64, step: u64) -> PyResult<Self> {
        Ok(StreamKey(Key::dropout(DropoutKey { seed, rank: u32_arg("rank", rank)?, step })))
    }

    /// The bug: one stream for every rank, worker and epoch.
    #[staticmethod]
    #[pyo3(signature = (*, seed))]
    fn naive(seed: u64) -> Self {
        StreamKey(Key::naive(seed))
    }

    /// The key by purpose name (`shuffle`, `augment`, `init`, `dropout`,
    /// `naive`); fields a purpose does not have must be 0 (`step` is a
    /// dropout key's, `epoch` the others').
    #[staticmethod]
    #[pyo3(signature = (purpose, *, seed, rank = 0, worker = 0, epoch = 0, step = 0, lane = 0))]
    fn of(
        purpose: &str,
        seed: u64,
        rank: u64,
        worker: u64,
        epoch: u64,
        step: u64,
        lane: u64,
    ) -> PyResult<Self> {
        let (rank, worker, lane) =
            (u32_arg("rank", rank)?, u32_arg("worker", worker)?, u32_arg("lane", lane)?);
        let unused = |field: &str, value: u64| -> PyResult<()> {
            if value == 0 {
                Ok(())
            } else {
                Err(PyValueError::new_err(format!("a {purpose} key has no {field} (got {field}={value})")))
            }
        };
        if purpose != "dropout" {
            unused("step", step)?;
        }
        let key = match purpose {
            "shuffle" => {
                unused("rank", rank.into())?;
                unused("worker", worker.into())?;
                Key::shuffle(ShuffleKey { seed, epoch })
            }
            "augment" => Key::augment(AugmentKey { seed, rank, worker, epoch }),
            "init" => {
                unused("rank", rank.into())?;
                unused("worker", worker.into())?;
                unused("epoch", epoch)?;
                Key::init(seed)
            }
            "dropout" => {
                unused("worker", worker.into())?;
                unused("epoch", epoch)?;
                Key::dropout(DropoutKey { seed, rank, step })
            }
            "naive" => {
                unused("rank", rank.into())?;
                unused("worker", worker.into())?;
                unused("epoch", epoch)?;
                Key::naive(seed)
            }
            other => {
                return Err(PyValueError::new_err(format!(
                    "purpose: unknown purpose {other:?} (expected shuffle, augment, init, dropout or naive)"
                )));
            }
        };
        Ok(StreamKey(key.with_lane(lane)))
    }

    /// The same key on lane `lane`: an independent sub-stream.
    fn with_lane(&self, lane: u64) -> PyResult<Self> {
        Ok(StreamKey(self.0.with_lane(u32_arg("lane", lane)?)))
    }

    /// The purpose, by name.
    #[getter]
    fn purpose(&self) -> String {
        self.0.purpose().to_string()
    }

    /// The base seed.
    #[getter]
    fn seed(&self) -> u64 {
        self.0.seed()
    }

    /// The rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.0.rank()
    }

    /// The loader worker.
    #[getter]
    fn worker(&self) -> u32 {
        self.0.worker()
    }

    /// The epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        self.0.epoch()
    }

    /// The lane.
    #[getter]
    fn lane(&self) -> u32 {
        self.0.lane()
    }

    /// Whether this is the bug's one shared stream.
    #[getter]
    fn is_naive(&self) -> bool {
        self.0.is_naive()
    }

    /// The twelve 32-bit words that are hashed (NumPy's `SeedSequence`
    /// entropy for this key).
    fn words(&self) -> Vec<u32> {
        self.0.words().to_vec()
    }

    /// The derived seed as the 64 hex digits `drove seed --json` prints.
    fn derived_seed(&self) -> String {
        self.0.derive().to_string()
    }

    /// The first `n` raw 64-bit outputs of the key's PCG-64 stream (`drove
    /// seed`'s `outputs`; NumPy's `PCG64(...).random_raw(n)`).
    #[pyo3(signature = (n = 4))]
    fn outputs(&self, n: usize) -> Vec<u64> {
        raw(self.0.derive(), n)
    }

    /// NumPy's `Generator(PCG64(SeedSequence(words)))` for this key: its
    /// `bit_generator.random_raw(n)` equals [`outputs`](Self::outputs).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let random = py.import("numpy.random")?;
        let entropy = random.getattr("SeedSequence")?.call1((self.words(),))?;
        let bits = random.getattr("PCG64")?.call1((entropy,))?;
        random.getattr("Generator")?.call1((bits,))
    }

    /// Python's `random.Random` seeded with the whole derived seed (256 bits).
    fn random<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let seed = py.import("builtins")?.getattr("int")?.call1((self.derived_seed(), 16))?;
        py.import("random")?.getattr("Random")?.call1((seed,))
    }

    /// A `torch.Generator` seeded with the derived seed's first 63 bits
    /// (torch takes one 64-bit seed); torch is imported on call.
    fn torch<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let seed = self.0.derive().words()[0] >> 1;
        let generator = py.import("torch")?.getattr("Generator")?.call0()?;
        generator.call_method1("manual_seed", (seed,))
    }

    fn __repr__(&self) -> String {
        format!("StreamKey({})", self.0)
    }
}

fn raw(seed: DerivedSeed, n: usize) -> Vec<u64> {
    use drove_seed::rand_core::Rng as _;
    let mut rng = seed.pcg64();
    (0..n).map(|_| rng.next_u64()).collect()
}

/// The first `n` raw outputs of the PCG-64 stream of a logged derived seed
/// (64 hex digits): a stream replayed from a log line.
#[pyfunction]
#[pyo3(signature = (derived_seed, n = 4))]
pub(crate) fn replay_outputs(derived_seed: &Bound<'_, PyAny>, n: usize) -> PyResult<Vec<u64>> {
    Ok(raw(logged_seed(derived_seed)?, n))
}

/// A logged derived seed (a str of 64 hex digits), or an error naming `derived_seed`.
pub(crate) fn logged_seed(derived_seed: &Bound<'_, PyAny>) -> PyResult<DerivedSeed> {
    let text: String = derived_seed
        .extract()
        .map_err(|_| PyTypeError::new_err("derived_seed must be a str of 64 hex digits"))?;
    text.parse().map_err(|e| PyValueError::new_err(format!("derived_seed: {e}")))
}

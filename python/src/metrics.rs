//! drove-metrics' recorder for Python: points buffered in bounded memory and
//! delivered at least once by a background thread to the run's coordinator,
//! a bounded flush at exit, and the launch contract (drove-launch) deciding
//! which coordinator, run and rank, exactly as for `drove train ner`.

use std::sync::Mutex;
use std::time::Duration;

use drove_launch::{CoordinatorSource, LaunchEnv};
use drove_metrics::{Delivery, MetricsRecorder, Reading, RecorderOptions, RecorderTarget};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A rank's metric points to a drove coordinator, delivered at least once.
///
/// Made in the process that records (a recorder's delivery thread does not
/// survive `fork`: a forked child that records gets an error, never points
/// silently lost).
#[pyclass(module = "drove", frozen)]
pub(crate) struct Metrics {
    recorder: Mutex<Option<MetricsRecorder>>,
    pid: u32,
    rank: usize,
    run_id: String,
    addr: String,
}

fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!("{name} must be a non-negative number of seconds, got {value}"))
    })
}

fn delivery_dict<'py>(py: Python<'py>, d: &Delivery) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("address", &d.addr)?;
    out.set_item("recorded", d.recorded)?;
    out.set_item("delivered", d.delivered)?;
    out.set_item("duplicates", d.duplicates)?;
    out.set_item("dropped", d.dropped)?;
    out.set_item("pending", d.pending)?;
    out.set_item("undelivered", d.undelivered())?;
    out.set_item("last_error", d.last_error.clone())?;
    out.set_item("summary", d.to_string())?;
    Ok(out)
}

#[pymethods]
impl Metrics {
    /// A recorder for `rank` of `run_id` to the coordinator at `address`.
    #[new]
    #[pyo3(signature = (address, *, run_id, rank, token = None, capacity = None, flush_timeout = None))]
    fn new(
        address: &str,
        run_id: &str,
        rank: usize,
        token: Option<&str>,
        capacity: Option<usize>,
        flush_timeout: Option<f64>,
    ) -> PyResult<Self> {
        let defaults = RecorderOptions::default();
        let options = RecorderOptions {
            capacity: capacity.unwrap_or(defaults.capacity),
            flush_timeout: match flush_timeout {
                Some(t) => seconds("flush_timeout", t)?,
                None => defaults.flush_timeout,
            },
            ..defaults
        };
        let recorder = MetricsRecorder::new(RecorderTarget { address, token, run_id, rank }, options)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Metrics::around(recorder, address, run_id, rank))
    }

    /// The recorder the launch environment gives this process (`drove run`,
    /// or any launch with `DROVE_COORDINATOR`: its run id, token, TLS CA and
    /// `DROVE_METRICS_*` settings), for `rank` (else the launcher's rank);
    /// `None` when no coordinator was given.
    #[staticmethod]
    #[pyo3(signature = (rank = None))]
    fn from_env(rank: Option<usize>) -> PyResult<Option<Self>> {
        let env = LaunchEnv::from_env()
            .map_err(|e| PyValueError::new_err(format!("the launch environment: {e}")))?;
        // A coordinator rank 0 would serve (MASTER_ADDR under torchrun) is
        // not running for a Python program: only a given one records.
        if env.coordinator_source != Some(CoordinatorSource::Given) {
            return Ok(None);
        }
        let Some(rank) = rank.or_else(|| env.rank().map(|r| r.get())) else {
            return Err(PyValueError::new_err(
                "rank: the launch environment names no rank (DROVE_RANK or RANK); pass rank=",
            ));
        };
        let run_id = env.run_id.clone().unwrap_or_else(|| drove_launch::DEFAULT_RUN_ID.to_string());
        let addr = env.coordinator.clone().unwrap_or_default();
        let recorder = env.metrics(rank).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(recorder.map(|r| Metrics::around(r, &addr, &run_id, rank)))
    }

    /// Records `value` of `name` at `step` (buffered; returns at once).
    fn record(&self, step: f64, name: &str, value: f64) -> PyResult<()> {
        self.with(|r| r.record(Reading { step, name, value }))
    }

    /// Records an event of the run (e.g. `diversity_alarm`) at once, waiting
    /// at most `timeout` seconds for the coordinator.
    #[pyo3(signature = (step, kind, message, *, timeout = 10.0))]
    fn event(&self, py: Python<'_>, step: f64, kind: &str, message: &str, timeout: f64) -> PyResult<()> {
        let timeout = seconds("timeout", timeout)?;
        let guard = self.live()?;
        let recorder = guard.as_ref().ok_or_else(closed)?;
        py.detach(|| recorder.event(step, kind, message, timeout))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Waits at most `timeout` seconds until every point so far is
    /// acknowledged; returns how many have been delivered. Raises
    /// `TimeoutError` naming what was not delivered.
    #[pyo3(signature = (timeout = 30.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<u64> {
        let timeout = seconds("timeout", timeout)?;
        let guard = self.live()?;
        let recorder = guard.as_ref().ok_or_else(closed)?;
        py.detach(|| recorder.flush(timeout))
            .map_err(|e| pyo3::exceptions::PyTimeoutError::new_err(e.to_string()))
    }

    /// What became of the points so far, as a dict.
    fn delivery<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let guard = self.live()?;
        let recorder = guard.as_ref().ok_or_else(closed)?;
        delivery_dict(py, &recorder.delivery())
    }

    /// Stops recording, waits at most the flush timeout for the points left
    /// and reports what became of them all (a dict); `None` if already closed.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let recorder = self.live()?.take();
        match recorder {
            Some(r) => {
                let delivery = py.detach(|| r.close());
                Ok(Some(delivery_dict(py, &delivery)?))
            }
            None => Ok(None),
        }
    }

    /// The rank the points are recorded for.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// The run the points belong to.
    #[getter]
    fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The coordinator's address.
    #[getter]
    fn address(&self) -> &str {
        &self.addr
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    fn __repr__(&self) -> String {
        format!("Metrics(address={:?}, run_id={:?}, rank={})", self.addr, self.run_id, self.rank)
    }
}

fn closed() -> PyErr {
    PyRuntimeError::new_err("the metrics recorder is closed")
}

impl Metrics {
    fn around(recorder: MetricsRecorder, addr: &str, run_id: &str, rank: usize) -> Self {
        Metrics {
            recorder: Mutex::new(Some(recorder)),
            pid: std::process::id(),
            rank,
            run_id: run_id.to_string(),
            addr: addr.to_string(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MetricsRecorder>> {
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The recorder, in the process that made it only.
    fn live(&self) -> PyResult<std::sync::MutexGuard<'_, Option<MetricsRecorder>>> {
        let pid = std::process::id();
        if pid != self.pid {
            return Err(PyRuntimeError::new_err(format!(
                "this metrics recorder was made in process {} and cannot be used in process {pid} \
                 (a fork's child: its delivery thread did not come along); make a new one there",
                self.pid
            )));
        }
        Ok(self.lock())
    }

    fn with(&self, f: impl FnOnce(&MetricsRecorder)) -> PyResult<()> {
        let guard = self.live()?;
        f(guard.as_ref().ok_or_else(closed)?);
        Ok(())
    }
}

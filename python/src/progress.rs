//! drove-launch's progress line for Python: rank 0 of a `drove run` on a
//! terminal (`DROVE_PROGRESS=launcher`) tells the launcher how far the run
//! is, and the launcher draws one bar for the whole world, as for `drove
//! train ner`. Elsewhere nothing is written.

use std::sync::OnceLock;

use drove_launch::{LaunchEnv, Progress, ProgressMode};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Whether this process sends progress lines: rank 0 (or alone) when the
/// launcher draws the bar. Read from the launch environment once.
fn sends() -> PyResult<bool> {
    static SENDS: OnceLock<Result<bool, String>> = OnceLock::new();
    SENDS
        .get_or_init(|| {
            let env = LaunchEnv::from_env().map_err(|e| format!("the launch environment: {e}"))?;
            Ok(env.progress == ProgressMode::Launcher && env.rank().is_none_or(|r| r.get() == 0))
        })
        .clone()
        .map_err(PyValueError::new_err)
}

/// Reports `step` of `total` (with the epoch, the latest loss, samples per
/// second over all ranks and what a sample is, where known) to `drove run`'s
/// bar. Returns whether a line was sent (only rank 0 under a launcher that
/// draws the bar sends one).
#[pyfunction]
#[pyo3(signature = (step, total, *, epoch = None, loss = None, samples_per_s = None, unit = None))]
pub(crate) fn progress(
    step: u64,
    total: u64,
    epoch: Option<u64>,
    loss: Option<f64>,
    samples_per_s: Option<f64>,
    unit: Option<String>,
) -> PyResult<bool> {
    if step > total {
        return Err(PyValueError::new_err(format!("step {step} is past total {total}")));
    }
    if !sends()? {
        return Ok(false);
    }
    Progress { step, total, epoch, loss, samples_per_s, unit }.send();
    Ok(true)
}

//! The `drove._drove` extension module: drove's crates for Python programs,
//! wrapped, not rewritten. `streams.rs`: drove-seed's stream keys;
//! `samples.rs`: its per-sample streams;
//! `mask.rs`: drove-collate's masker over NumPy arrays; `sampler.rs`: its
//! distributed sampler; `diag.rs`: its mask-agreement diagnostic;
//! `metrics.rs`: drove-metrics' recorder, from the launch contract
//! (drove-launch); `progress.rs`: drove-launch's progress line for `drove
//! run`'s bar; `watch.rs`: drove-watch's comparison of the watcher's notes
//! and the watcher's own source, for `python -m drove.watch`. The Python side (`drove/`) re-exports them and holds the
//! framework glue (`drove.torch`, `drove.horovod`).

mod diag;
mod mask;
mod metrics;
mod progress;
mod sampler;
mod samples;
mod streams;
mod watch;

use drove_metrics::metric_names as names;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// The metric and event names a drove run records under (drove-proto's
/// `metric_names`), so Python and Rust cannot drift apart.
fn metric_names<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (key, name) in names::ALL {
        d.set_item(*key, *name)?;
    }
    for (key, name) in names::event::ALL {
        d.set_item(format!("EVENT_{key}"), *name)?;
    }
    Ok(d)
}

/// Panics with `message`: the tests' proof that a panic inside the extension
/// reaches Python as an exception (`pyo3_runtime.PanicException`), never a
/// crash of the interpreter.
#[pyfunction]
fn _panic_for_tests(message: &str) {
    panic!("{message}");
}

#[pymodule]
fn _drove(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<streams::StreamKey>()?;
    m.add_function(wrap_pyfunction!(streams::replay_outputs, m)?)?;
    m.add_class::<samples::SampleStreams>()?;
    m.add_function(wrap_pyfunction!(samples::replay_sample_outputs, m)?)?;
    m.add_class::<mask::Masker>()?;
    m.add_class::<sampler::Sampler>()?;
    m.add_class::<diag::AgreementReport>()?;
    m.add_function(wrap_pyfunction!(diag::agreement, m)?)?;
    m.add_function(wrap_pyfunction!(diag::expected_agreement, m)?)?;
    m.add_function(wrap_pyfunction!(diag::grad_cosine, m)?)?;
    m.add_class::<metrics::Metrics>()?;
    m.add_function(wrap_pyfunction!(progress::progress, m)?)?;
    m.add("metric_names", metric_names(m.py())?)?;
    m.add_class::<watch::NoteComparer>()?;
    m.add("WATCHER_SOURCE", drove_watch::PYTHON_WATCHER)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    Ok(())
}

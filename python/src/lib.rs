//! The `drove._drove` extension module: drove's crates for Python programs,
//! wrapped, not rewritten. `streams.rs`: drove-seed's stream keys;
//! `mask.rs`: drove-collate's masker over NumPy arrays. The Python side
//! (`drove/`) re-exports them.

mod mask;
mod streams;

use pyo3::prelude::*;

#[pymodule]
fn _drove(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<streams::StreamKey>()?;
    m.add_function(wrap_pyfunction!(streams::replay_outputs, m)?)?;
    m.add_class::<mask::Masker>()?;
    Ok(())
}

//! drove-collate's mask-agreement diagnostic for Python: every rank's mask,
//! already gathered by the framework (torch.distributed, Horovod), compared
//! position by position at positions maskable on both, and judged against
//! the 3-sigma band of independent masks, by the same code as `drove train
//! ner`'s diagnostic.

use drove_diagnostic::{AgreementAccumulator, AgreementReport as Inner, GradCosine, RowMasks};
use numpy::{PyReadonlyArray2, PyReadonlyArray3, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::mask::described;

/// One diagnostic's result: how often the ranks' masks agree, beside what
/// independent masks would give.
#[pyclass(module = "drove", frozen)]
pub(crate) struct AgreementReport(Inner);

#[pymethods]
impl AgreementReport {
    /// Ranks compared.
    #[getter]
    fn world_size(&self) -> usize {
        self.0.world_size
    }

    /// The mask probability compared against.
    #[getter]
    fn probability(&self) -> f64 {
        self.0.probability
    }

    /// Mean agreement over every pair of ranks.
    #[getter]
    fn mean_agreement(&self) -> f64 {
        self.0.mean_agreement
    }

    /// `p^2 + (1-p)^2`: the agreement of independent masks.
    #[getter]
    fn expected(&self) -> f64 {
        self.0.expected
    }

    /// The standard deviation of `mean_agreement` for independent masks.
    #[getter]
    fn sigma(&self) -> f64 {
        self.0.sigma
    }

    /// `(mean - expected) / (1 - expected)`: 0 independent, 1 identical.
    #[getter]
    fn normalised(&self) -> f64 {
        self.0.normalised
    }

    /// Whether the mean lies within `expected +- 3 sigma`.
    #[getter]
    fn within_3_sigma(&self) -> bool {
        self.0.within_3_sigma
    }

    /// `"diverse"`, `"identical"` or `"anticorrelated"`.
    #[getter]
    fn verdict(&self) -> &'static str {
        self.0.verdict.word()
    }

    /// Whether the diversity alarm went off (anything but diverse).
    #[getter]
    fn alarm(&self) -> bool {
        self.0.is_alarm()
    }

    /// Rank-by-rank agreement (1.0 on the diagonal).
    #[getter]
    fn matrix(&self) -> Vec<Vec<f64>> {
        self.0.matrix.clone()
    }

    /// `(rank a, rank b, agreement, positions compared)` for every pair.
    #[getter]
    fn pairs(&self) -> Vec<(usize, usize, f64, u64)> {
        self.0.pairs.iter().map(|p| (p.a, p.b, p.agreement, p.compared)).collect()
    }

    /// What the verdict means, in a sentence (the alarm event's message).
    fn explain(&self) -> String {
        self.0.explain()
    }

    /// The report as a dict (JSON-ready).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("world_size", self.0.world_size)?;
        d.set_item("probability", self.0.probability)?;
        d.set_item("mean_agreement", self.0.mean_agreement)?;
        d.set_item("expected", self.0.expected)?;
        d.set_item("sigma", self.0.sigma)?;
        d.set_item("normalised", self.0.normalised)?;
        d.set_item("within_3_sigma", self.0.within_3_sigma)?;
        d.set_item("verdict", self.0.verdict.word())?;
        d.set_item("alarm", self.0.is_alarm())?;
        d.set_item("matrix", self.0.matrix.clone())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "AgreementReport(world_size={}, mean_agreement={:.4}, expected={:.4}, sigma={:.4}, verdict={:?})",
            self.0.world_size,
            self.0.mean_agreement,
            self.0.expected,
            self.0.sigma,
            self.0.verdict.word()
        )
    }
}

fn stacked<'py>(name: &str, array: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray3<'py, bool>> {
    array.extract::<PyReadonlyArray3<'py, bool>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a 3-D NumPy array of bool (ranks x rows x positions), got {}",
            described(array)
        ))
    })
}

/// Compares every rank's mask of its own batch: `chosen[r]` and
/// `maskable[r]` are rank `r`'s (rows x positions), all ranks' stacked on
/// the first axis. Returns an [`AgreementReport`].
#[pyfunction]
#[pyo3(signature = (chosen, maskable, *, probability))]
pub(crate) fn agreement(
    py: Python<'_>,
    chosen: &Bound<'_, PyAny>,
    maskable: &Bound<'_, PyAny>,
    probability: f64,
) -> PyResult<AgreementReport> {
    if !(0.0..=1.0).contains(&probability) {
        return Err(PyValueError::new_err(format!("probability must be in [0, 1], got {probability}")));
    }
    let chosen = stacked("chosen", chosen)?;
    let maskable = stacked("maskable", maskable)?;
    if chosen.shape() != maskable.shape() {
        return Err(PyValueError::new_err(format!(
            "maskable has shape {:?}, but chosen has shape {:?}",
            maskable.shape(),
            chosen.shape()
        )));
    }
    let (ranks, width) = (chosen.shape()[0], chosen.shape()[2]);
    if ranks == 0 {
        return Err(PyValueError::new_err("chosen holds no rank's mask (its first axis is empty)"));
    }
    let (c, m) = (chosen.as_array(), maskable.as_array());
    let masks: Vec<RowMasks> = (0..ranks)
        .map(|r| RowMasks {
            width,
            chosen: c.index_axis(numpy::ndarray::Axis(0), r).iter().copied().collect(),
            maskable: m.index_axis(numpy::ndarray::Axis(0), r).iter().copied().collect(),
        })
        .collect();
    let report = py.detach(|| {
        let mut acc = AgreementAccumulator::new(ranks, probability);
        acc.add_step(&masks);
        acc.report()
    });
    Ok(AgreementReport(report))
}

/// `p^2 + (1-p)^2`: how often two independent masks of probability `p` agree.
#[pyfunction]
pub(crate) fn expected_agreement(probability: f64) -> PyResult<f64> {
    if !(0.0..=1.0).contains(&probability) {
        return Err(PyValueError::new_err(format!("probability must be in [0, 1], got {probability}")));
    }
    Ok(drove_diagnostic::expected_agreement(probability))
}

/// The cosine of every pair of ranks' gradients: `gradients[r]` is rank `r`'s
/// (ranks x values, float64). Returns `(matrix, mean over pairs)`, as
/// drove-diagnostic's `GradCosine` computes it for the Rust trainer.
#[pyfunction]
pub(crate) fn grad_cosine(py: Python<'_>, gradients: &Bound<'_, PyAny>) -> PyResult<(Vec<Vec<f64>>, f64)> {
    let gradients = gradients.extract::<PyReadonlyArray2<'_, f64>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "gradients must be a 2-D NumPy array of float64 (ranks x values), got {}",
            described(gradients)
        ))
    })?;
    let rows: Vec<Vec<f64>> = gradients.as_array().rows().into_iter().map(|r| r.to_vec()).collect();
    let result = py.detach(|| GradCosine::of(&rows));
    Ok((result.matrix, result.mean))
}

//! drove-collate's masker over NumPy arrays: the same masks, bit for bit, as
//! the Rust masker for the same (seed, epoch, sample), each row masked from
//! its sample's own stream, with the GIL released while it masks.

use drove_collate::{MaskAction, MaskConfig, Masker as Inner};
use drove_seed::{Purpose, SampleStreams};
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// BERT-style masking as augmentation: each maskable position chosen with
/// `probability`, a chosen one replaced by the mask token, a random token or
/// kept (`mask_fraction`, `random_fraction`, `keep_fraction`); special tokens
/// and padding (not `maskable`) never chosen; with `whole_word`, every subword
/// shares its word's first subword's choice.
#[pyclass(module = "drove", frozen)]
pub(crate) struct Masker {
    inner: Inner,
    mask_token: u32,
    vocab_size: u32,
}

/// What one call masks: the rows as the Rust masker takes them.
struct Rows {
    rows: usize,
    cols: usize,
    ids: Vec<u32>,
    maskable: Vec<bool>,
    continues: Option<Vec<bool>>,
    samples: Vec<u64>,
}

/// `what`'s dtype and number of dimensions, in words, for an error.
pub(crate) fn described(array: &Bound<'_, PyAny>) -> String {
    let dtype = array.getattr("dtype").map(|d| d.to_string()).unwrap_or_else(|_| "no dtype".into());
    let ndim = array.getattr("ndim").map(|d| d.to_string()).unwrap_or_else(|_| "?".into());
    format!(
        "{} (dtype {dtype}, ndim {ndim})",
        array.get_type().name().map(|n| n.to_string()).unwrap_or_default()
    )
}

fn ids_of(ids: &Bound<'_, PyAny>) -> PyResult<(usize, usize, Vec<u32>)> {
    fn take<T: Copy + numpy::Element + TryInto<u32>>(
        a: PyReadonlyArray2<'_, T>,
    ) -> PyResult<(usize, usize, Vec<u32>)> {
        let view = a.as_array();
        let (rows, cols) = view.dim();
        let mut out = Vec::with_capacity(rows * cols);
        for v in view.iter() {
            out.push(
                (*v).try_into().map_err(|_| PyValueError::new_err("ids: a token id outside [0, 2**32)"))?,
            );
        }
        Ok((rows, cols, out))
    }
    if let Ok(a) = ids.extract::<PyReadonlyArray2<'_, i64>>() {
        return take(a);
    }
    if let Ok(a) = ids.extract::<PyReadonlyArray2<'_, i32>>() {
        return take(a);
    }
    if let Ok(a) = ids.extract::<PyReadonlyArray2<'_, u32>>() {
        return take(a);
    }
    Err(PyTypeError::new_err(format!(
        "ids must be a 2-D NumPy array of int64, int32 or uint32 token ids, got {}",
        described(ids)
    )))
}

fn flags_of(name: &str, array: &Bound<'_, PyAny>, rows: usize, cols: usize) -> PyResult<Vec<bool>> {
    let a = array.extract::<PyReadonlyArray2<'_, bool>>().map_err(|_| {
        PyTypeError::new_err(format!("{name} must be a 2-D NumPy array of bool, got {}", described(array)))
    })?;
    if a.shape() != [rows, cols] {
        return Err(PyValueError::new_err(format!(
            "{name} has shape {:?}, but ids has shape [{rows}, {cols}]",
            a.shape()
        )));
    }
    Ok(a.as_array().iter().copied().collect())
}

fn samples_of(samples: &Bound<'_, PyAny>, rows: usize) -> PyResult<Vec<u64>> {
    let a = samples.extract::<PyReadonlyArray1<'_, i64>>().map_err(|_| {
        PyTypeError::new_err(format!(
            "samples must be a 1-D NumPy array of int64 sample indices, got {}",
            described(samples)
        ))
    })?;
    if a.len() != rows {
        return Err(PyValueError::new_err(format!(
            "samples has {} entries, but ids has {rows} rows",
            a.len()
        )));
    }
    a.as_array()
        .iter()
        .map(|&s| {
            u64::try_from(s).map_err(|_| PyValueError::new_err(format!("samples: a negative index {s}")))
        })
        .collect()
}

#[pymethods]
impl Masker {
    #[new]
    #[pyo3(signature = (*, mask_token, vocab_size, probability = 0.15, mask_fraction = 0.8,
                        random_fraction = 0.1, keep_fraction = 0.1, whole_word = false))]
    fn new(
        mask_token: u32,
        vocab_size: u32,
        probability: f64,
        mask_fraction: f64,
        random_fraction: f64,
        keep_fraction: f64,
        whole_word: bool,
    ) -> PyResult<Self> {
        let config = MaskConfig { probability, mask_fraction, random_fraction, keep_fraction, whole_word };
        Inner::new(config, mask_token, vocab_size)
            .map(|inner| Masker { inner, mask_token, vocab_size })
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Masks `ids` (rows x positions) where `maskable`, row `r` from the
    /// per-sample stream of (`seed`, augment, `epoch`, `samples[r]`), so a
    /// sample's mask depends on neither its batch nor the world size.
    /// Returns `(masked ids as int64, actions as uint8)`: 0 not chosen, 1
    /// the mask token, 2 a random token, 3 kept.
    #[pyo3(signature = (ids, maskable, *, seed, epoch, samples, continues_word = None))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn mask<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
        maskable: &Bound<'py, PyAny>,
        seed: u64,
        epoch: u64,
        samples: &Bound<'py, PyAny>,
        continues_word: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyArray2<i64>>, Bound<'py, PyArray2<u8>>)> {
        let (rows, cols, ids) = ids_of(ids)?;
        let input = Rows {
            rows,
            cols,
            ids,
            maskable: flags_of("maskable", maskable, rows, cols)?,
            continues: continues_word.map(|c| flags_of("continues_word", c, rows, cols)).transpose()?,
            samples: samples_of(samples, rows)?,
        };
        let (masked, actions) = py.detach(|| self.mask_rows(input, seed, epoch));
        let masked = PyArray1::from_vec(py, masked).reshape([rows, cols])?;
        let actions = PyArray1::from_vec(py, actions).reshape([rows, cols])?;
        Ok((masked, actions))
    }

    /// The probability a maskable position is chosen.
    #[getter]
    fn probability(&self) -> f64 {
        self.inner.config().probability
    }

    /// Whether whole words are chosen together.
    #[getter]
    fn whole_word(&self) -> bool {
        self.inner.config().whole_word
    }

    /// The token a chosen position becomes 80% of the time.
    #[getter]
    fn mask_token(&self) -> u32 {
        self.mask_token
    }

    /// Random replacements are drawn from `0..vocab_size`.
    #[getter]
    fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// Pickling (a `DataLoader`'s spawned workers get the dataset, and the
    /// masker in it, by pickle): the constructor's keyword arguments.
    fn __getnewargs_ex__<'py>(&self, py: Python<'py>) -> PyResult<((), Bound<'py, pyo3::types::PyDict>)> {
        let c = self.inner.config();
        let kw = pyo3::types::PyDict::new(py);
        kw.set_item("mask_token", self.mask_token)?;
        kw.set_item("vocab_size", self.vocab_size)?;
        kw.set_item("probability", c.probability)?;
        kw.set_item("mask_fraction", c.mask_fraction)?;
        kw.set_item("random_fraction", c.random_fraction)?;
        kw.set_item("keep_fraction", c.keep_fraction)?;
        kw.set_item("whole_word", c.whole_word)?;
        Ok(((), kw))
    }
}

impl Masker {
    fn mask_rows(&self, mut input: Rows, seed: u64, epoch: u64) -> (Vec<i64>, Vec<u8>) {
        let streams = SampleStreams::new(seed, Purpose::Augment, epoch);
        let mut actions = vec![MaskAction::None; input.rows * input.cols];
        for r in 0..input.rows {
            let row = r * input.cols..(r + 1) * input.cols;
            let continues = input.continues.as_ref().map(|c| &c[row.clone()]);
            self.inner.mask_row(
                &mut input.ids[row.clone()],
                &input.maskable[row.clone()],
                continues,
                &mut actions[row],
                &mut streams.stream(input.samples[r]),
            );
        }
        (input.ids.into_iter().map(i64::from).collect(), actions.into_iter().map(|a| a as u8).collect())
    }
}

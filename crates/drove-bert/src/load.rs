//! Loading HuggingFace-layout safetensors weights by name: `bert.` prefix or none,
//! PyTorch `[out, in]` linear weights transposed to burn's `[in, out]`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::SafeTensors;

use crate::BertError;
use crate::model::{BertForTokenClassification, Embeddings, Layer, set};

/// What a load found: names expected but absent (left as initialised), and
/// names present but not used.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Parameters the model has but the file does not (e.g. a new classifier).
    pub missing: Vec<String>,
    /// Tensors the file has but the model does not use (e.g. the pooler).
    pub unexpected: Vec<String>,
    /// Tensors loaded.
    pub loaded: usize,
}

/// A tensor's values (f32) and shape.
type Values = (Vec<f32>, Vec<usize>);

struct TensorFile<'a> {
    path: PathBuf,
    tensors: SafeTensors<'a>,
    prefix: &'static str,
    used: BTreeSet<String>,
}

impl TensorFile<'_> {
    /// The tensor `name` (with or without `bert.`), as f32 values and shape.
    fn get(&mut self, name: &str, expected: &[usize]) -> Result<Option<Values>, BertError> {
        let full = format!("{}{name}", self.prefix);
        let key = if self.tensors.names().iter().any(|n| **n == full) { full } else { name.to_string() };
        let Ok(view) = self.tensors.tensor(&key) else { return Ok(None) };
        let shape = view.shape().to_vec();
        if shape != expected {
            return Err(BertError::Shape {
                path: self.path.clone(),
                tensor: key,
                expected: expected.to_vec(),
                found: shape,
            });
        }
        let values: Vec<f32> = match view.dtype() {
            safetensors::Dtype::F32 => {
                view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            }
            other => {
                return Err(BertError::Weights {
                    path: self.path.clone(),
                    message: format!("tensor {key} is {other:?}; only F32 is supported"),
                });
            }
        };
        self.used.insert(key);
        Ok(Some((values, shape)))
    }
}

fn tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: Vec<usize>,
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Loads weights from a HuggingFace safetensors file into `model`.
///
/// Every tensor is matched by name (`embeddings.word_embeddings.weight`,
/// `encoder.layer.N.attention.self.query.weight`, ..., `classifier.weight`), with
/// or without the `bert.` prefix. A shape that differs is an error naming the
/// tensor and both shapes; absent and unused tensors are reported.
pub fn load_safetensors<B: Backend>(
    model: &mut BertForTokenClassification<B>,
    path: impl AsRef<Path>,
    device: &B::Device,
) -> Result<LoadReport, BertError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path)
        .map_err(|e| BertError::Weights { path: path.to_path_buf(), message: format!("cannot read: {e}") })?;
    drove_safetensors::check_header(&bytes).map_err(|message| BertError::Weights {
        path: path.to_path_buf(),
        message: format!("not a safetensors file: {message}"),
    })?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| BertError::Weights {
        path: path.to_path_buf(),
        message: format!("not a safetensors file: header: {e}"),
    })?;
    let prefix = if tensors.names().iter().any(|n| n.starts_with("bert.")) { "bert." } else { "" };
    let src = TensorFile { path: path.to_path_buf(), tensors, prefix, used: BTreeSet::new() };
    let mut loader = ModelLoader { src, report: LoadReport::default(), device };
    loader.embeddings(&mut model.bert.embeddings)?;
    for (i, l) in model.bert.layers.iter_mut().enumerate() {
        loader.layer(&format!("encoder.layer.{i}."), l)?;
    }
    // The classifier is named without the prefix in HF's BertForTokenClassification.
    let saved_prefix = loader.src.prefix;
    loader.src.prefix = "";
    loader.linear(&mut model.classifier, "classifier")?;
    loader.src.prefix = saved_prefix;
    Ok(loader.finish())
}

/// Sets the model's parameters from a [`TensorFile`], one by one, and counts what
/// it loaded and missed.
struct ModelLoader<'a, 'd, B: Backend> {
    src: TensorFile<'a>,
    report: LoadReport,
    device: &'d B::Device,
}

impl<B: Backend> ModelLoader<'_, '_, B> {
    /// A parameter of any rank, stored in burn's shape; `transpose` for a
    /// linear weight, stored as PyTorch's `[out, in]`.
    fn param<const D: usize>(
        &mut self,
        param: &mut Param<Tensor<B, D>>,
        name: String,
        transpose: bool,
    ) -> Result<(), BertError> {
        let mut dims = param.dims().to_vec();
        if transpose {
            dims.reverse();
        }
        match self.src.get(&name, &dims)? {
            Some((v, s)) => {
                let value = tensor::<B, D>(v, s, self.device);
                set(param, if transpose { value.transpose() } else { value });
                self.report.loaded += 1;
            }
            None => self.report.missing.push(name),
        }
        Ok(())
    }

    fn embeddings(&mut self, e: &mut Embeddings<B>) -> Result<(), BertError> {
        self.param(&mut e.word.weight, "embeddings.word_embeddings.weight".into(), false)?;
        self.param(&mut e.position.weight, "embeddings.position_embeddings.weight".into(), false)?;
        self.param(&mut e.token_type.weight, "embeddings.token_type_embeddings.weight".into(), false)?;
        self.norm(&mut e.norm, "embeddings.LayerNorm")
    }

    /// The layer whose names start with `p` (`encoder.layer.N.`).
    fn layer(&mut self, p: &str, l: &mut Layer<B>) -> Result<(), BertError> {
        for (lin, name) in [
            (&mut l.query, "attention.self.query"),
            (&mut l.key, "attention.self.key"),
            (&mut l.value, "attention.self.value"),
            (&mut l.attention_output, "attention.output.dense"),
            (&mut l.intermediate, "intermediate.dense"),
            (&mut l.output, "output.dense"),
        ] {
            self.linear(lin, &format!("{p}{name}"))?;
        }
        for (ln, name) in
            [(&mut l.attention_norm, "attention.output.LayerNorm"), (&mut l.output_norm, "output.LayerNorm")]
        {
            self.norm(ln, &format!("{p}{name}"))?;
        }
        Ok(())
    }

    /// `NAME.weight` (transposed) and `NAME.bias`.
    fn linear(&mut self, lin: &mut Linear<B>, name: &str) -> Result<(), BertError> {
        self.param(&mut lin.weight, format!("{name}.weight"), true)?;
        self.param(bias(&mut lin.bias), format!("{name}.bias"), false)
    }

    /// `NAME.weight` (gamma) and `NAME.bias` (beta).
    fn norm(&mut self, ln: &mut LayerNorm<B>, name: &str) -> Result<(), BertError> {
        self.param(&mut ln.gamma, format!("{name}.weight"), false)?;
        self.param(bias(&mut ln.beta), format!("{name}.bias"), false)
    }

    /// The report, with the file's tensors that nothing used.
    fn finish(self) -> LoadReport {
        let mut report = self.report;
        report.unexpected = self
            .src
            .tensors
            .names()
            .into_iter()
            .filter(|n| !self.src.used.contains(*n) && !n.ends_with("position_ids"))
            .map(|n| n.to_string())
            .collect();
        report.unexpected.sort();
        report
    }
}

fn bias<B: Backend>(p: &mut Option<Param<Tensor<B, 1>>>) -> &mut Param<Tensor<B, 1>> {
    p.as_mut().expect("linear layers and LayerNorms here have a bias")
}

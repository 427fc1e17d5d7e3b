//! Loading HuggingFace-layout safetensors weights by name: `bert.` prefix or none,
//! PyTorch `[out, in]` linear weights transposed to burn's `[in, out]`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::SafeTensors;

use crate::BertError;
use crate::model::{BertForTokenClassification, set};

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

struct Source<'a> {
    path: PathBuf,
    tensors: SafeTensors<'a>,
    prefix: &'static str,
    used: BTreeSet<String>,
}

impl Source<'_> {
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
    let mut src = Source { path: path.to_path_buf(), tensors, prefix, used: BTreeSet::new() };
    let mut report = LoadReport::default();

    macro_rules! load2 {
        ($param:expr, $name:expr, transpose) => {{
            let name: String = $name;
            let [d_in, d_out] = $param.dims();
            match src.get(&name, &[d_out, d_in])? {
                Some((v, s)) => {
                    set(&mut $param, tensor::<B, 2>(v, s, device).transpose());
                    report.loaded += 1;
                }
                None => report.missing.push(name),
            }
        }};
        ($param:expr, $name:expr) => {{
            let name: String = $name;
            let dims = $param.dims().to_vec();
            match src.get(&name, &dims)? {
                Some((v, s)) => {
                    set(&mut $param, tensor::<B, 2>(v, s, device));
                    report.loaded += 1;
                }
                None => report.missing.push(name),
            }
        }};
    }
    macro_rules! load1 {
        ($param:expr, $name:expr) => {{
            let name: String = $name;
            let dims = $param.dims().to_vec();
            match src.get(&name, &dims)? {
                Some((v, s)) => {
                    set(&mut $param, tensor::<B, 1>(v, s, device));
                    report.loaded += 1;
                }
                None => report.missing.push(name),
            }
        }};
    }
    fn bias<B: Backend>(p: &mut Option<Param<Tensor<B, 1>>>) -> &mut Param<Tensor<B, 1>> {
        p.as_mut().expect("linear layers and LayerNorms here have a bias")
    }

    let e = &mut model.bert.embeddings;
    load2!(e.word.weight, "embeddings.word_embeddings.weight".into());
    load2!(e.position.weight, "embeddings.position_embeddings.weight".into());
    load2!(e.token_type.weight, "embeddings.token_type_embeddings.weight".into());
    load1!(e.norm.gamma, "embeddings.LayerNorm.weight".into());
    load1!(*bias(&mut e.norm.beta), "embeddings.LayerNorm.bias".into());
    for (i, l) in model.bert.layers.iter_mut().enumerate() {
        let p = format!("encoder.layer.{i}.");
        for (lin, name) in [
            (&mut l.query, "attention.self.query"),
            (&mut l.key, "attention.self.key"),
            (&mut l.value, "attention.self.value"),
            (&mut l.attention_output, "attention.output.dense"),
            (&mut l.intermediate, "intermediate.dense"),
            (&mut l.output, "output.dense"),
        ] {
            load2!(lin.weight, format!("{p}{name}.weight"), transpose);
            load1!(*bias(&mut lin.bias), format!("{p}{name}.bias"));
        }
        for (ln, name) in
            [(&mut l.attention_norm, "attention.output.LayerNorm"), (&mut l.output_norm, "output.LayerNorm")]
        {
            load1!(ln.gamma, format!("{p}{name}.weight"));
            load1!(*bias(&mut ln.beta), format!("{p}{name}.bias"));
        }
    }
    // The classifier is named without the prefix in HF's BertForTokenClassification.
    let saved_prefix = src.prefix;
    src.prefix = "";
    load2!(model.classifier.weight, "classifier.weight".into(), transpose);
    load1!(*bias(&mut model.classifier.bias), "classifier.bias".into());
    src.prefix = saved_prefix;

    report.unexpected = src
        .tensors
        .names()
        .into_iter()
        .filter(|n| !src.used.contains(*n) && !n.ends_with("position_ids"))
        .map(|n| n.to_string())
        .collect();
    report.unexpected.sort();
    Ok(report)
}

//! The token classifier: loaded from a HuggingFace folder, and its loss.

use burn::backend::Flex;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use drove_bert::{BertConfig, BertForTokenClassification};
use drove_seed::StreamKey;

use crate::data::{FETCH_HINT, require};
use crate::{NerError, NerOptions};

/// Reads `config.json` (with the dropout override) and loads the weights into a
/// token classifier for `labels` labels; the classifier head starts from the
/// seed's initialisation stream on every rank.
pub fn load_model<B: Backend>(
    opts: &NerOptions,
    labels: usize,
    device: &B::Device,
) -> Result<(BertForTokenClassification<B>, drove_bert::LoadReport), NerError> {
    let config = read_config(opts)?;
    let config_path = opts.model.join("config.json");
    let weights = opts.model.join("model.safetensors");
    if !opts.random_init {
        require("model weights", &weights, FETCH_HINT)?;
    }
    let mut model = initialised::<B>(&config, labels, opts.seed, device)?
        .with_sum_order(opts.gpu_step.sum_order())
        .with_matmul(opts.gpu_step.matmul_op());
    if opts.random_init {
        let report = drove_bert::LoadReport { missing: Vec::new(), unexpected: Vec::new(), loaded: 0 };
        return Ok((model, report));
    }
    let report = drove_bert::load_safetensors(&mut model, &weights, device).map_err(|e| match e {
        drove_bert::BertError::Shape { path, tensor, expected, found } => drove_bert::BertError::Config {
            path: config_path.clone(),
            message: format!(
                "sizes disagree with {}: tensor {tensor} has shape {found:?}, but config.json implies {expected:?}",
                path.display()
            ),
        },
        other => other,
    })?;
    Ok((model, report))
}

/// Reads `config.json` with the dropout override, and refuses a `--max-len`
/// longer than its position table: a token past it would read outside the
/// table (a panic on the CPU, an out-of-bounds read on a GPU).
pub(crate) fn read_config(opts: &NerOptions) -> Result<BertConfig, NerError> {
    let path = opts.model.join("config.json");
    require("model config", &path, FETCH_HINT)?;
    let mut config = BertConfig::from_file(&path)?;
    if let Some(p) = opts.dropout {
        config.hidden_dropout_prob = p;
        config.attention_probs_dropout_prob = p;
    }
    if opts.max_len > config.max_position_embeddings {
        return Err(NerError::MaxLen {
            max_len: opts.max_len,
            positions: config.max_position_embeddings,
            path,
        });
    }
    Ok(config)
}

/// A token classifier with its initial parameters drawn on the CPU (flex)
/// from the seed's initialisation stream, then written onto `device`: the
/// backends' random generators differ, so a run on a GPU starts from the very
/// parameters a CPU run does, and a checkpoint resumes on either.
fn initialised<B: Backend>(
    config: &BertConfig,
    labels: usize,
    seed: u64,
    device: &B::Device,
) -> Result<BertForTokenClassification<B>, NerError> {
    let cpu = Default::default();
    Flex::seed(&cpu, StreamKey::init(seed).derive().words()[0]);
    let drawn = drove_train::flat::FlatParams::read(&config.init_token_classification::<Flex>(labels, &cpu))?;
    Ok(drawn.write(config.init_token_classification::<B>(labels, device), device))
}

/// The token cross-entropy, summed over labelled tokens and multiplied by
/// `scale`; returns the loss tensor and the local mean for display.
pub(crate) fn loss<B: Backend>(
    logits: Tensor<B, 3>,
    labels: &[i64],
    num_labels: usize,
    scale: f64,
    device: &B::Device,
) -> Tensor<B, 1> {
    let [b, s, l] = logits.dims();
    let mut onehot = vec![0f32; b * s * num_labels];
    for (i, &y) in labels.iter().enumerate() {
        if y >= 0 {
            onehot[i * num_labels + y as usize] = 1.0;
        }
    }
    let target: Tensor<B, 2> = drove_kernels::transfer::upload(TensorData::new(onehot, [b * s, l]), device);
    let logp = log_softmax(logits.reshape([b * s, l]), 1);
    (logp * target).sum().neg() * scale
}

/// [`load_model`], with every encoder tensor required from the weights (only
/// the classifier head may start from its initialisation).
pub(crate) fn load_encoder<B: Backend>(
    opts: &NerOptions,
    labels: usize,
    device: &B::Device,
) -> Result<BertForTokenClassification<B>, NerError> {
    let (model, report) = load_model::<B>(opts, labels, device)?;
    if !report.missing.iter().all(|n| n.starts_with("classifier")) {
        return Err(NerError::Options(format!(
            "{}: the weights lack encoder tensors {:?}",
            opts.model.join("model.safetensors").display(),
            report.missing
        )));
    }
    Ok(model)
}

//! Fixtures the weight-loading tests share.
#![allow(dead_code)] // each test file uses its own part

use drove_bert::BertConfig;

/// Every tensor of a HuggingFace BERT checkpoint of `config`'s shapes, named
/// with `prefix` (`""` or `"bert."`), with the pooler, and with a classifier
/// of `labels` classes if given: (name, PyTorch shape).
pub fn hf_tensors(config: &BertConfig, prefix: &str, labels: Option<usize>) -> Vec<(String, Vec<usize>)> {
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let mut t: Vec<(String, Vec<usize>)> = vec![
        (format!("{prefix}embeddings.word_embeddings.weight"), vec![config.vocab_size, h]),
        (format!("{prefix}embeddings.position_embeddings.weight"), vec![config.max_position_embeddings, h]),
        (format!("{prefix}embeddings.token_type_embeddings.weight"), vec![config.type_vocab_size, h]),
        (format!("{prefix}embeddings.LayerNorm.weight"), vec![h]),
        (format!("{prefix}embeddings.LayerNorm.bias"), vec![h]),
        (format!("{prefix}pooler.dense.weight"), vec![h, h]),
    ];
    for l in 0..config.num_hidden_layers {
        let p = format!("{prefix}encoder.layer.{l}.");
        for (name, out, inp) in [
            ("attention.self.query", h, h),
            ("attention.self.key", h, h),
            ("attention.self.value", h, h),
            ("attention.output.dense", h, h),
            ("intermediate.dense", i, h),
            ("output.dense", h, i),
        ] {
            t.push((format!("{p}{name}.weight"), vec![out, inp]));
            t.push((format!("{p}{name}.bias"), vec![out]));
        }
        for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
            t.push((format!("{p}{name}.weight"), vec![h]));
            t.push((format!("{p}{name}.bias"), vec![h]));
        }
    }
    if let Some(n) = labels {
        t.push(("classifier.weight".into(), vec![n, h]));
        t.push(("classifier.bias".into(), vec![n]));
    }
    t
}

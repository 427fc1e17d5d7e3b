//! The model's sizes, read from a HuggingFace `config.json`.

use std::path::{Path, PathBuf};

use crate::BertError;

/// The fields of a HuggingFace BERT `config.json` that shape the model.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct BertConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Width of every hidden state.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer (must divide `hidden_size`).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Activation of the feed-forward layer; only `gelu` (exact) is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Dropout after embeddings, attention output and feed-forward output.
    #[serde(default = "default_dropout")]
    pub hidden_dropout_prob: f64,
    /// Dropout on attention probabilities.
    #[serde(default = "default_dropout")]
    pub attention_probs_dropout_prob: f64,
    /// Longest sequence the position embeddings cover.
    pub max_position_embeddings: usize,
    /// Token types (segments).
    #[serde(default = "default_types")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_dropout() -> f64 {
    0.1
}
fn default_types() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}

impl BertConfig {
    /// Reads and checks a `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, BertError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| BertError::Config {
            path: path.to_path_buf(),
            message: format!("cannot read: {e}"),
        })?;
        let err = |message: String| BertError::Config { path: path.to_path_buf(), message };
        // Through a `Value`: syntax errors name the line and column, the others
        // the field (and carry no position that would not point at it).
        let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if !json.is_object() {
            return Err(err(format!("expected a JSON object of fields, found {}", kind(&json))));
        }
        // Through serde_path_to_error: serde's own type errors ("invalid type:
        // string \"x\", expected usize") name no field.
        let config: BertConfig = serde_path_to_error::deserialize(json).map_err(|e| {
            let path = e.path().to_string();
            err(if path == "." {
                e.into_inner().to_string()
            } else {
                format!("field `{path}`: {}", e.into_inner())
            })
        })?;
        config.validate(path)?;
        Ok(config)
    }

    /// Checks that the sizes fit together.
    pub fn validate(&self, path: &Path) -> Result<(), BertError> {
        let err = |message: String| Err(BertError::Config { path: PathBuf::from(path), message });
        if self.num_attention_heads == 0 || !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        for (name, size) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if size == 0 {
                return err(format!("{name} must be at least 1, found 0"));
            }
        }
        for (name, rows, cols) in [
            ("vocab_size", self.vocab_size, self.hidden_size),
            ("max_position_embeddings", self.max_position_embeddings, self.hidden_size),
            ("intermediate_size", self.intermediate_size, self.hidden_size),
        ] {
            if rows.checked_mul(cols).is_none_or(|n| n > isize::MAX as usize / 4) {
                return err(format!("{name} {rows} times hidden_size {cols} is too many parameters to hold"));
            }
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return err(format!("layer_norm_eps must be a positive number, found {}", self.layer_norm_eps));
        }
        if self.hidden_act != "gelu" {
            return err(format!("hidden_act {:?} is not supported (only \"gelu\")", self.hidden_act));
        }
        for (name, p) in [
            ("hidden_dropout_prob", self.hidden_dropout_prob),
            ("attention_probs_dropout_prob", self.attention_probs_dropout_prob),
        ] {
            if !(0.0..1.0).contains(&p) {
                return err(format!("{name} must be in [0, 1), found {p}"));
            }
        }
        Ok(())
    }

    /// A tiny configuration for tests.
    pub fn tiny(vocab_size: usize) -> Self {
        BertConfig {
            vocab_size,
            hidden_size: 32,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 64,
            hidden_act: "gelu".into(),
            hidden_dropout_prob: 0.1,
            attention_probs_dropout_prob: 0.1,
            max_position_embeddings: 64,
            type_vocab_size: 2,
            layer_norm_eps: 1e-12,
        }
    }
}

/// What a JSON value is, for messages.
fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

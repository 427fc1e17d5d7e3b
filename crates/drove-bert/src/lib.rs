//! # drove-bert: a BERT for token classification, on burn
//!
//! A BERT encoder (word, position and token-type embeddings with LayerNorm; N
//! layers of multi-head self-attention and an exact-GELU feed-forward, each
//! followed by a residual LayerNorm) and a token-classification head, written as
//! plain burn modules generic over the backend (`Flex` on CPU by default). Sizes,
//! epsilons and dropouts come from a HuggingFace `config.json`; weights load from
//! a HuggingFace-layout safetensors file by name, with or without the `bert.`
//! prefix, with a report of missing and unused tensors and an error naming any
//! tensor whose shape differs.
//!
//! On the CPU backend two pieces run drove's own code rather than burn's, with
//! the same results: [`dropout`] draws its masks from explicitly seeded
//! per-row streams, and [`gelu`] evaluates the exact GELU with a vectorised
//! `erf`.
//!
//! This crate knows nothing of data loading or of distribution: it is the model.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Int, Tensor};
//! use drove_bert::BertConfig;
//!
//! let device = Default::default();
//! let model = BertConfig::tiny(100).init_token_classification::<Flex>(9, &device);
//! let ids = Tensor::<Flex, 2, Int>::from_ints([[1, 5, 7, 2]], &device);
//! let types = ids.zeros_like();
//! let mask = Tensor::<Flex, 2>::ones([1, 4], &device);
//! let logits = model.forward(ids, types, mask);
//! assert_eq!(logits.dims(), [1, 4, 9]);
//! ```
#![deny(missing_docs)]

mod config;
mod dropout;
mod gelu;
mod load;
mod model;
mod sum_order;

use std::path::PathBuf;

pub use config::BertConfig;
pub use dropout::{Masks, dropout, dropout_masks, seed_dropout, seed_dropout_rows, set_dropout_masks};
/// The safetensors header check run before every read (from `drove-safetensors`).
pub use drove_safetensors::check_header as check_safetensors_header;
pub use gelu::gelu;
pub use load::{LoadReport, load_safetensors};
pub use model::{Bert, BertForTokenClassification, Embeddings, Layer, mask_bias};
pub use sum_order::{DEFAULT_ROWS_PER_CHUNK, DenseSums, EmbeddingSums, MAX_CHUNKS, SumOrder, TokenTypes};

/// A model that cannot be built or loaded.
#[derive(Debug, thiserror::Error)]
pub enum BertError {
    /// A bad `config.json`.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A weights file that cannot be used.
    #[error("{path}: {message}")]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor whose shape disagrees with the configuration.
    #[error("{path}: tensor {tensor} has shape {found:?}, but the configuration needs {expected:?}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shape the model needs.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
}

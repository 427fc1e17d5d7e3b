//! # drove
//!
//! A toolkit for data-parallel training in the style of Horovod whose ranks and
//! loader workers never share a random stream, and which measures it when they do.
//!
//! This facade re-exports the crates so that the examples and cross-crate tests at
//! the root of the repository can use them together. Each crate is useful alone:
//!
//! - [`seed`]: derivation of independent random streams from a whole key.
//! - [`collate`]: CoNLL reading, WordPiece alignment, MLM-style masking, the
//!   distributed sampler, padding and the worker pool, and the diagnostic on
//!   simulated ranks.
//! - [`diagnostic`]: mask agreement, gradient cosine and their verdict.
#![deny(missing_docs)]

pub use drove_collate as collate;
pub use drove_diagnostic as diagnostic;
pub use drove_seed as seed;

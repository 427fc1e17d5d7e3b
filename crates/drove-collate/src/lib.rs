//! # drove-collate: data for data-parallel token classification, without shared randomness
//!
//! Everything between a CoNLL file and a padded, masked batch, for one rank of a
//! data-parallel run; it knows nothing of networks or tensors.
//!
//! - [`conll`]: the CoNLL reader (IOB1 detected and converted to IOB2; errors name
//!   file and line) and the [`LabelSet`].
//! - `tokenize` (feature `tokenize`, on by default): WordPiece through the
//!   `tokenizers` crate from a `vocab.txt`, with label alignment (first subword
//!   keeps the label, the rest `-100`).
//! - [`mask`]: MLM-style masking as augmentation (p, 80/10/10, whole words).
//! - [`sampler`]: PyTorch's `DistributedSampler` semantics.
//! - [`batch`]: padding, collation and length bucketing.
//! - [`loader`]: a thread pool building batches ahead, each worker with its own
//!   stream.
//! - [`entities`]: entity-level precision, recall and F1 (conlleval/seqeval
//!   default mode) as counts that ranks can sum.
//! - [`diag`]: a simulated run of every rank's loader, its masks compared by
//!   `drove-diagnostic` (the agreement, its band and the verdict live there).
//!
//! The one design decision that matters: **the masker draws one number for every
//! position of the padded row**, so stream consumption does not depend on the data.
//! Identical streams then give identical mask patterns on different sentences, which
//! is exactly the bug the naive seeding reproduces; and a per-sample stream gives a
//! sample the same mask whichever batch, worker or rank it lands in, which is what
//! makes the default seeding reproducible when a run is re-sharded.
//!
//! ```
//! use drove_collate::{diag, MaskSeeding};
//!
//! let naive = diag::simulate(&diag::Simulation { seeding: MaskSeeding::Naive, ..Default::default() })?;
//! assert_eq!(naive.mean_agreement, 1.0);
//! let derived = diag::simulate(&diag::Simulation::default())?;
//! assert!(derived.within_3_sigma, "{} vs {}", derived.mean_agreement, derived.expected);
//! # Ok::<(), drove_collate::diag::SimulationError>(())
//! ```
#![deny(missing_docs)]

pub mod batch;
pub mod conll;
pub mod diag;
pub mod entities;
mod example;
pub mod loader;
pub mod mask;
pub mod sampler;
#[cfg(feature = "tokenize")]
pub mod tokenize;

pub use batch::{Batch, Bucketing, CollateError, Collator, Example, MaskSource, Padding, make_batches};
pub use conll::{ConllError, Corpus, LabelSet, Sentence, TagScheme, read_conll};
pub use example::IGNORE_LABEL;
pub use loader::{Epoch, Loader, LoaderConfig, LoaderError, MaskSeeding};
pub use mask::{MaskAction, MaskConfig, MaskConfigError, Masker};
pub use sampler::{DistributedSampler, Remainder, SamplerError, SamplerOptions};
#[cfg(feature = "tokenize")]
pub use tokenize::{SpecialTokens, TokenizeError, WordPieceTokenizer};

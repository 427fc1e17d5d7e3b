//! # drove-diagnostic: is data-parallel augmentation diverse across ranks?
//!
//! The classic multi-GPU augmentation bug gives every rank the same random
//! stream: each masks its own batch exactly as the others do, and the extra
//! ranks add no augmentation diversity. Nothing crashes and the loss still
//! falls, so it has to be measured. This crate is the measurement, in one
//! place, for the NER trainer (`drove-ner`), `drove report`, `drove diag masks`
//! and the Python package:
//!
//! - [`agreement`]: how often two ranks' masks of their own batches agree,
//!   position by position, against `p^2 + (1-p)^2` for independent masks and
//!   a 3-sigma band that accounts for pairs sharing a rank
//!   ([`AgreementAccumulator`], [`AgreementReport`]);
//! - [`cosine()`]: the cosine of the ranks' local gradients of one parameter
//!   ([`GradCosine`]);
//! - [`Verdict`]: the one vocabulary of what a step or a run tells (`diverse`,
//!   `identical`, `anticorrelated`, `outliers`, `not_diagnosed`).
//!
//! The names of the points a run records (`mask_agreement`, `grad_cosine`,
//! `diversity_alarm`, ...) are the wire's, listed once in `drove-proto`'s
//! `metric_names`. This crate knows no tensor, transport or file: callers
//! gather the masks and gradients (an all-gather in the trainer, `torch.distributed`
//! in Python) and hand them here.
//!
//! ```
//! use drove_diagnostic::{AgreementAccumulator, RowMasks, Verdict};
//!
//! // Two ranks that drew the same mask of 8 positions, 8 steps running.
//! let mask = RowMasks { width: 8, chosen: vec![true, false, false, true, false, false, false, false], maskable: vec![true; 8] };
//! let mut run = AgreementAccumulator::new(2, 0.15);
//! for _ in 0..8 {
//!     run.add_step(&[mask.clone(), mask.clone()]);
//! }
//! let report = run.report();
//! assert_eq!(report.verdict, Verdict::Identical);
//! assert!(report.is_alarm());
//! ```
#![deny(missing_docs)]

pub mod agreement;
pub mod cosine;
mod verdict;

pub use agreement::{AgreementAccumulator, AgreementReport, PairAgreement, RowMasks, expected_agreement};
pub use cosine::{GradCosine, cosine};
pub use verdict::Verdict;

//! # drove-ner: fine-tuning a BERT for named-entity recognition on N ranks
//!
//! The application of drove's pieces: CoNLL-format data read and collated by
//! `drove-collate` (masked as augmentation from per-sample streams), a BERT
//! token classifier from `drove-bert`, and the distributed step of
//! `drove-train` ([`drove_train::Replica`]) through the [`Collective`] trait.
//! It lives apart from `drove-train` so that a user of the generic step does
//! not depend on tokenizers or on BERT.
//!
//! Each step: the rank's batch (its shard, masked as augmentation from its own
//! stream), forward, a token-level cross-entropy normalised by the labelled
//! tokens of the **global** batch (so N ranks x B rows equal one rank x N*B rows
//! exactly), backward, gradients averaged across ranks, clipped by their global
//! norm, and an AdamW update with warmup and linear decay. Every epoch the ranks
//! evaluate their slices of the evaluation sets, sum entity-level TP/FP/FN across
//! ranks, and rank 0 writes the predictions and a checkpoint.
//!
//! One concept a file: the settings (`options.rs`), the data and its batches
//! (`data.rs`), the model and its loss (`model.rs`), the loop (`fit.rs`),
//! evaluation (`eval.rs`), the cross-rank diagnostic (`diagnose.rs`), what the
//! loop tells its caller (`observer.rs`), its outcome (`summary.rs`), the
//! metrics observer (`metrics.rs`) and the GPU's wiring (`gpu.rs`).
//!
//! ## Features
//!
//! All are off by default, so that a program calling [`train_ner`] with
//! [`NerOptions`] of its own depends on neither a flag parser, gRPC nor CUDA;
//! `drove train ner` turns on `clap` and `metrics` (and `cuda`, `nccl` in
//! its GPU build).
//!
//! - `clap`: [`NerOptions`] derives `clap::Args`, so the options, their flags,
//!   help text and defaults are one type: a command flattens it
//!   (`#[command(flatten)]`) and adds only its own flags. A feature rather than
//!   a plain dependency, because the library is also driven without a command
//!   line (the example, benchmarks, tests).
//! - `metrics`: `MetricsObserver`, an [`Observer`] that records the loop's
//!   reports to a coordinator through `drove-metrics` (a gRPC client), kept
//!   behind a feature so the fine-tune itself never depends on a transport.
//! - `cuda`: [`open_gpu`] opens `--device cuda[:N]` (drove-device's [`Gpu`])
//!   and [`GpuTraining`] trains on burn-cubecl over CUDA with
//!   the backend placement (the CUDA libraries are loaded at run time; a
//!   machine without them gets an error naming the missing one). Without it,
//!   [`open_gpu`] says how to build a drove that has it.
//! - `nccl` (with `cuda`): on more than one rank, [`GpuTraining::train_ner`]'s
//!   gradient buckets are all-reduced by NCCL on the GPU, in place.
//! - `wgpu`: [`open_gpu`] opens `--device wgpu[:N]` (any GPU burn's wgpu reaches
//!   through Vulkan, Metal or DX12; Mesa's lavapipe without one) and trains
//!   with the backend placement, gradient buckets staged through the host
//!   and averaged by the [`Collective`], in fixed and elastic worlds alike.
//!
//! [`Collective`]: drove_collective::Collective
#![deny(missing_docs)]

mod data;
mod diagnose;
mod error;
mod eval;
mod fit;
#[cfg(feature = "clap")]
pub mod flags;
mod gpu;
mod gpu_step;
#[cfg(feature = "metrics")]
mod metrics;
mod model;
mod observer;
mod options;
mod prewarm;
mod summary;
mod token_mean;
mod trace;

/// The burn backends a fine-tune runs on: `Autodiff<Flex>` on the CPU, and
/// `Autodiff` over the GPU backend where one is built in.
pub mod backend {
    pub use burn::backend::{Autodiff, Flex};
}

pub use data::NerData;
pub use drove_device::kernels;
pub use drove_device::{BUILD_HINT, DeviceChoice, Gpu, GradientPath, list_devices};
pub use drove_train::Placement;
pub use error::NerError;
pub use eval::EvalReport;
pub use fit::{train_ner, train_ner_elastic, train_ner_with};
pub use gpu::{GpuTraining, open_gpu};
pub use gpu_step::{DenseGrad, DropoutMasks, EmbeddingGrad, GpuStep, MatmulChoice, Prewarm};
#[cfg(feature = "metrics")]
pub use metrics::MetricsObserver;
pub use model::load_model;
pub use observer::{DiagnoseReport, Observer, Quiet, ReformReport, StepReport};
pub use options::{DEFAULT_BUCKET_WINDOW, DEFAULT_DIAGNOSE_EVERY, MaskAlarm, NerOptions};
pub use summary::{NerSummary, StepScale};
pub use trace::{TraceLine, mask_hash};

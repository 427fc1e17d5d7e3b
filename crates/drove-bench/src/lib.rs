//! # drove-bench: drove's benchmarks as functions
//!
//! Each suite is a function that takes its options and returns a report:
//! [`mask::run`] (the masker, collation and the loader pool),
//! [`allreduce::run`] (all-reduce and broadcast across N local rank
//! processes), [`coordinator::run`] (a coordinator's rendezvous, metric
//! ingest and blob services), [`train::run`] (training throughput at one
//! rank), [`scaling::run`] (one rank of a training run across ranks, its
//! steps split into compute and exposed communication) and, with feature `nccl`, `nccl::run` and `nccl::in_place` (NCCL
//! bandwidth on a GPU, and the in-place check of training's gradient path).
//! `drove bench ...` is a thin call of them that prints the report.
//!
//! The one decision: a benchmark is a program that prints JSON, so that a
//! figure can be compared run to run; here the JSON is a type. Every report
//! derives `serde::Serialize` (its keys are the JSON's, the same whoever calls
//! it) and `Display` where the command shows a table, and holds baselines
//! measured in the same run on the same machine ([`Machine`]: a memory copy,
//! an RNG, sha256), so that a figure from a noisy machine can be quoted as a
//! ratio. Medians are over timed iterations after a warm-up, all through one
//! helper, and progress is one spinner on stderr (drawn only when stderr is a
//! terminal and the options ask for it); nothing here prints to stdout.
//!
//! ## Features
//!
//! All off by default.
//!
//! - `clap`: each suite's options derive `clap::Args`, so the options, their
//!   flags, help text and defaults are one type; `drove bench` flattens them
//!   (`#[command(flatten)]`) and adds only `--json`. Their `Default` is
//!   parsing no flags (a test holds the two together).
//! - `cuda`: the training suite on CUDA (drove-device's; the libraries are
//!   loaded at run time).
//! - `nccl`: the NCCL suite, through drove-nccl on drove-device's raw device
//!   buffers, and drove-device's in-place check.
//!
//! ```no_run
//! let options = drove_bench::mask::MaskOptions { seconds: 0.2, ..Default::default() };
//! let report = drove_bench::mask::run(&options)?;
//! assert!(report.masker_tokens_per_s > 0.0);
//! # Ok::<(), drove_bench::BenchError>(())
//! ```
#![deny(missing_docs)]

pub mod allreduce;
pub mod coordinator;
mod error;
#[cfg(feature = "clap")]
mod flags;
mod machine;
pub mod mask;
pub mod matmul;
mod measure;
pub mod nccl;
pub mod scaling;
mod size;
pub mod train;

pub use error::BenchError;
pub use machine::Machine;
pub use measure::median;
pub use size::{Sizes, human, parse_bytes};

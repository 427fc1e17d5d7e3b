//! The crate's errors: [`TrainError`], what a distributed step, its options or
//! its state can fail with, and [`CheckpointError`], what writing or reading a
//! checkpoint can (re-exported as `checkpoint::CheckpointError`).

use std::path::PathBuf;

use drove_collective::CommError;

/// A distributed step that failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Options that cannot work.
    #[error("invalid option: {0}")]
    Options(String),
    /// The ranks do not hold the same state.
    #[error("ranks disagree: {0}")]
    Disagree(String),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The device failed, or could not average a bucket of gradients.
    #[error(transparent)]
    Device(#[from] drove_device::DeviceError),
    /// A step's loss or global gradient norm was not finite: no update was
    /// applied, and every rank stops with this error.
    #[error(
        "step {step}: the {what} is {value}, not finite ({}); no update was applied",
        if ranks.is_empty() { "every rank's local loss is finite".to_string() }
        else { format!("local loss not finite on rank(s) {ranks:?}") }
    )]
    NonFinite {
        /// The step that failed (1-based: the update it would have been).
        step: u64,
        /// What was not finite: `loss` or `global gradient norm`.
        what: &'static str,
        /// Its value.
        value: f64,
        /// The ranks whose own loss was not finite.
        ranks: Vec<usize>,
    },
    /// A tensor could not be read as f32.
    #[error("parameter {index} could not be read as f32: {message}")]
    Data {
        /// Position of the parameter in module order.
        index: usize,
        /// What went wrong.
        message: String,
    },
}

/// A checkpoint that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be read or written.
    #[error("checkpoint {path}: {message}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// A file that is not what a checkpoint holds.
    #[error("checkpoint {path} is unreadable: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A checkpoint of a different run shape.
    #[error("checkpoint {path} does not fit this run: {message}")]
    Mismatch {
        /// The checkpoint folder.
        path: PathBuf,
        /// What differs.
        message: String,
    },
}

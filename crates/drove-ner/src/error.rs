//! What stops a fine-tune.

use std::path::PathBuf;

use drove_train::checkpoint;

/// A fine-tune that cannot start or could not go on.
#[derive(Debug, thiserror::Error)]
pub enum NerError {
    /// A missing asset folder or file.
    #[error("{what} {path} does not exist{hint}")]
    Missing {
        /// What was expected.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// How to get it.
        hint: String,
    },
    /// Bad data.
    #[error(transparent)]
    Data(#[from] drove_collate::ConllError),
    /// Tokenization failed.
    #[error("{path}: {source}")]
    Tokenize {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: drove_collate::TokenizeError,
    },
    /// A bad model.
    #[error(transparent)]
    Model(#[from] drove_bert::BertError),
    /// Bad settings.
    #[error("invalid option: {0}")]
    Options(String),
    /// `--max-len` is longer than the model's position table.
    #[error(
        "--max-len {max_len} is longer than the model's position table: {path} gives \
         max_position_embeddings {positions}; use --max-len {positions} or less (longer sentences are truncated)"
    )]
    MaxLen {
        /// The `--max-len` asked for.
        max_len: usize,
        /// The positions the model has.
        positions: usize,
        /// Its `config.json`.
        path: PathBuf,
    },
    /// The loader failed.
    #[error(transparent)]
    Loader(#[from] drove_collate::LoaderError),
    /// An evaluation batch could not be formed.
    #[error(transparent)]
    Collate(#[from] drove_collate::CollateError),
    /// A collective failed (a rank died or disagreed).
    #[error(transparent)]
    Comm(#[from] drove_collective::CommError),
    /// A step failed.
    #[error(transparent)]
    Train(#[from] drove_train::TrainError),
    /// The device could not be opened (or asked) for training.
    #[error("--device {device}: {reason}")]
    Device {
        /// The device asked for.
        device: drove_device::DeviceChoice,
        /// What failed (in this error's message, so not a `source` that an
        /// error chain would print a second time).
        reason: drove_device::DeviceError,
    },
    /// The diversity alarm with `--on-identical-masks fail`: every rank
    /// stopped at a diagnosed step whose masks were identical across ranks.
    #[error("the diversity alarm stopped the run at {message}")]
    IdenticalMasks {
        /// The step.
        step: u64,
        /// The step and what the alarm means.
        message: String,
    },
    /// A checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    /// An output file could not be written.
    #[error("{path}: {message}")]
    Output {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

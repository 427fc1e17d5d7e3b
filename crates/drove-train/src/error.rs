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
    /// An option of [`ReplicaOptions`](crate::ReplicaOptions) that cannot work.
    #[error("invalid option: {field} {message}")]
    Options {
        /// The field, dotted (`adamw.beta1`).
        field: &'static str,
        /// What it must be, and what it is.
        message: String,
    },
    /// The threads of the micro-batches could not be started.
    #[error("could not start the micro-batch threads: {0}")]
    Threads(#[from] rayon::ThreadPoolBuildError),
    /// A step was given a batch without rows.
    #[error("a step needs a batch of at least one row")]
    EmptyBatch,
    /// [`Replica::apply`](crate::Replica::apply) with no backward pass since the last update.
    #[error("apply needs a backward pass first")]
    NoBackward,
    /// A backward pass after the step's last one, whose gradients are
    /// averaged already (the overlapped pass): the update comes first.
    #[error(
        "backward pass {pass} of a step of {passes}: the last pass averaged the gradients already; call apply first"
    )]
    StepComplete {
        /// The pass asked for (1-based).
        pass: usize,
        /// `backward_passes_per_step`.
        passes: usize,
    },
    /// A local gradient that is not kept.
    #[error("no local gradient {index}: {why}")]
    NoLocalGradient {
        /// The parameter, module order.
        index: usize,
        /// Why.
        why: NoLocalGradient,
    },
    /// A micro-batch's thread stopped (panicked) during an overlapped backward pass.
    #[error("micro-batch {micro} stopped during backward")]
    MicroBatchFailed {
        /// The micro-batch.
        micro: usize,
    },
    /// Backward handed over a gradient of another length than its parameter's.
    #[error("parameter {param}: a gradient of {found} values for {expected} elements")]
    GradientLength {
        /// The parameter, module order.
        param: usize,
        /// The values handed over.
        found: usize,
        /// The parameter's elements.
        expected: usize,
    },
    /// An overlapped backward pass ended before every gradient of a bucket arrived.
    #[error("backward ended before gradients.bucket{bucket} was whole")]
    BucketIncomplete {
        /// The bucket, plan order.
        bucket: usize,
    },
    /// A device bucket all-reduce given to a replica that keeps its
    /// gradients on the host.
    #[error(
        "a bucket all-reduce replaces host staging of the backend placement only; this replica's placement is host"
    )]
    NotOnDevice,
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

/// Why [`Replica::local_gradient`](crate::Replica::local_gradient) has no gradient to give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoLocalGradient {
    /// No backward pass since the last update.
    #[error("no backward pass since the last update")]
    NoPass,
    /// The overlapped pass averaged it during backward without keeping it.
    #[error(
        "the overlapped pass averaged it during backward; name the parameter in ReplicaOptions::keep_local_gradient to keep it"
    )]
    Averaged,
    /// There is no parameter of that index.
    #[error("the model has no parameter of that index")]
    NoParameter,
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

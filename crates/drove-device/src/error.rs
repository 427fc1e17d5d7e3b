//! [`DeviceError`]: what opening a device, reading it, or averaging
//! gradients on it can fail with.

use drove_collective::CommError;

/// A device that is missing, failed, or could not average a bucket.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The GPU, or a library it needs, is missing or failed: the message
    /// names which, and what to install or set instead.
    #[error("{0}")]
    Gpu(String),
    /// The host collective failed (a bucket's all-reduce, or a check across
    /// ranks before a device op).
    #[error(transparent)]
    Comm(#[from] CommError),
}

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
    /// NCCL or the CUDA driver it needs cannot be loaded, or a call failed.
    #[cfg(feature = "nccl")]
    #[error(transparent)]
    GpuLibrary(#[from] drove_nccl::GpuLibraryError),
    /// An NCCL op failed on the device (its host collective's failures are
    /// [`DeviceError::Comm`]).
    #[cfg(feature = "nccl")]
    #[error(transparent)]
    Nccl(drove_nccl::Error),
    /// A bucket all-reduce returned a bucket of another length than it was
    /// given.
    #[error("{bucket}: the bucket all-reduce returned {found} values for a bucket of {expected}")]
    BucketLength {
        /// The bucket's op name.
        bucket: String,
        /// The values returned.
        found: usize,
        /// The values the bucket holds.
        expected: usize,
    },
}

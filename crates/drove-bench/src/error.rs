//! What stops a benchmark.

use std::error::Error;

/// A suite that could not run, or whose figures or answers came out wrong.
/// Each message says what was being done and why it failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A step of a suite failed: what it was doing, and the cause with the
    /// causes under it.
    #[error("{doing}: {}", chain(cause.as_ref()))]
    During {
        /// What was being done (`building the loader`, `starting rank 1`).
        doing: String,
        /// Why it failed.
        cause: Box<dyn Error + Send + Sync>,
    },
    /// A collective failed.
    #[error(transparent)]
    Comm(#[from] drove_collective::CommError),
    /// A coordinator could not be reached.
    #[error(transparent)]
    Connect(#[from] drove_launch::LaunchError),
    /// The fine-tune under measurement failed.
    #[error("{0}")]
    Ner(drove_ner::NerError),
    /// A coordinator call was refused or failed (its status, in words).
    #[error("{0}")]
    Status(String),
    /// A device call failed (drove-device's error: the call and the
    /// driver's answer).
    #[error(transparent)]
    Device(#[from] drove_device::DeviceError),
    /// A collective through drove-nccl failed: the op, and the mesh's error
    /// or the GPU library's under it.
    #[cfg(feature = "nccl")]
    #[error(transparent)]
    Nccl(#[from] drove_nccl::Error),
    /// A result that is not what it must be (a wrong sum, a figure that is
    /// not a positive number, a rank that failed).
    #[error("{0}")]
    Check(String),
}

/// `e` and every cause under it, `: `-separated (as `anyhow` shows a chain).
fn chain(e: &(dyn Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

impl BenchError {
    /// `cause`, met while `doing`.
    pub fn during(doing: impl Into<String>, cause: impl Into<Box<dyn Error + Send + Sync>>) -> BenchError {
        BenchError::During { doing: doing.into(), cause: cause.into() }
    }
}

/// Names what was being done when a result failed.
pub(crate) trait Doing<T> {
    /// The error, met while `doing`.
    fn doing(self, doing: &str) -> Result<T, BenchError>;
    /// The error, met while doing what `doing` says (made only on failure).
    fn doing_with(self, doing: impl FnOnce() -> String) -> Result<T, BenchError>;
}

impl<T, E: Into<Box<dyn Error + Send + Sync>>> Doing<T> for Result<T, E> {
    fn doing(self, doing: &str) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::during(doing, e))
    }

    fn doing_with(self, doing: impl FnOnce() -> String) -> Result<T, BenchError> {
        self.map_err(|e| BenchError::during(doing(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_step_names_what_it_did_and_every_cause() {
        let inner = std::io::Error::other("inner");
        let e: Result<(), Outer> = Err(Outer(inner));
        let e = e.doing("opening it").unwrap_err();
        assert_eq!(e.to_string(), "opening it: outer: inner");
        assert!(e.source().is_none(), "the causes are in the message, not repeated below it");
        let nested: Result<(), BenchError> = Err(e);
        assert_eq!(
            nested.doing("rendezvous").unwrap_err().to_string(),
            "rendezvous: opening it: outer: inner"
        );
    }
}

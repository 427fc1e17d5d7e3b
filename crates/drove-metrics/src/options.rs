//! [`RecorderOptions`]: how a [`MetricsRecorder`](crate::MetricsRecorder)
//! buffers, retries and gives up (drove-launch fills them from the
//! environment: `DROVE_METRICS_CAPACITY`, `DROVE_METRICS_FLUSH_SECS`).

use std::path::PathBuf;
use std::time::Duration;

use crate::RecorderError;

/// How a [`MetricsRecorder`](crate::MetricsRecorder) buffers, retries and gives up.
#[derive(Clone, Debug)]
pub struct RecorderOptions {
    /// Most points held waiting for the coordinator; past it the oldest are
    /// dropped and counted. At least `batch`.
    pub capacity: usize,
    /// Most points per push.
    pub batch: usize,
    /// How long [`MetricsRecorder::close`](crate::MetricsRecorder::close) (and drop) waits for the last points.
    pub flush_timeout: Duration,
    /// The first wait after a failed push; it doubles up to `max_backoff`, each
    /// wait shortened by up to a half at random so ranks do not retry in step.
    pub min_backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// One push's deadline (connecting included).
    pub push_timeout: Duration,
    /// The CA file trusted for an `https://` coordinator (none: plain text
    /// only; drove-launch reads it from `DROVE_TLS_CA`).
    pub tls_ca: Option<PathBuf>,
}

impl Default for RecorderOptions {
    fn default() -> Self {
        RecorderOptions {
            capacity: 1 << 20,
            batch: 4096,
            flush_timeout: Duration::from_secs(30),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            push_timeout: Duration::from_secs(20),
            tls_ca: None,
        }
    }
}

impl RecorderOptions {
    /// Checks that the options can work, naming the one at fault.
    pub fn check(&self) -> Result<(), RecorderError> {
        let bad = |name: &str, message: String| Err(RecorderError::Setting { name: name.into(), message });
        if self.batch == 0 {
            return bad("batch", "must be at least 1, found 0".into());
        }
        if self.capacity < self.batch {
            return bad(
                "capacity",
                format!("must be at least the batch ({}), found {}", self.batch, self.capacity),
            );
        }
        if self.min_backoff.is_zero() || self.min_backoff > self.max_backoff {
            return bad(
                "min_backoff",
                format!(
                    "must be above 0 and at most max_backoff ({:?}), found {:?}",
                    self.max_backoff, self.min_backoff
                ),
            );
        }
        if self.push_timeout.is_zero() {
            return bad("push_timeout", "must be above 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_out_of_range_are_named() {
        let o = RecorderOptions { capacity: 10, batch: 100, ..RecorderOptions::default() };
        let e = o.check().unwrap_err().to_string();
        assert!(e.starts_with("capacity: must be at least the batch (100), found 10"), "{e}");
        let o = RecorderOptions { batch: 0, ..RecorderOptions::default() };
        assert!(o.check().unwrap_err().to_string().starts_with("batch:"));
        let o = RecorderOptions { min_backoff: Duration::from_secs(9), ..RecorderOptions::default() };
        assert!(o.check().unwrap_err().to_string().starts_with("min_backoff:"));
    }
}

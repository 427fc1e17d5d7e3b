//! [`RecorderError`]: what setting a recorder up, recording an event or
//! waiting for the points can fail with.

use std::time::Duration;

/// What can go wrong setting a recorder up or waiting for it.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    /// A setting is out of range; names the setting.
    #[error("{name}: {message}")]
    Setting {
        /// The setting (an environment variable or an option field).
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// The background thread could not be started.
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
    /// An event could not be recorded.
    #[error("recording the event on the coordinator at {addr}: {message}")]
    Event {
        /// The coordinator.
        addr: String,
        /// Why.
        message: String,
    },
    /// [`MetricsRecorder::flush`](crate::MetricsRecorder::flush) ran out of time.
    #[error("{undelivered} metric point(s) not acknowledged by the coordinator at {addr} within {waited:.1?}{}",
        last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default())]
    NotDelivered {
        /// The coordinator.
        addr: String,
        /// Points still waiting.
        undelivered: u64,
        /// How long the flush waited.
        waited: Duration,
        /// The last push error, if any.
        last_error: Option<String>,
    },
}

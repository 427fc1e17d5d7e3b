//! # drove-metrics: metric points to a coordinator, at least once
//!
//! Training code records `(step, name, value)` from synchronous code;
//! [`MetricsRecorder`] holds the points in bounded memory and a background
//! thread pushes them in batches to a drove coordinator's `Metrics.Push`.
//! Delivery survives the coordinator going away:
//!
//! - a batch leaves the buffer only when the coordinator has acknowledged it;
//!   a failed push is retried, on a new connection, after a capped, jittered
//!   backoff, so a coordinator restarted on the same store and address gets
//!   every point;
//! - a point resent because its acknowledgement was lost is acknowledged again
//!   and not stored twice: the coordinator keeps one point per (run, rank,
//!   name, step);
//! - the buffer holds at most [`RecorderOptions::capacity`] points (1 Mi by
//!   default); past it the oldest are dropped, counted and reported;
//! - [`MetricsRecorder::close`] waits at most [`RecorderOptions::flush_timeout`]
//!   for the last points and says how many were not delivered: an unreachable
//!   coordinator costs metrics, never the training run.
//!
//! ```no_run
//! use drove_metrics::{MetricsRecorder, Reading, RecorderOptions, RecorderTarget};
//!
//! let target = RecorderTarget { address: "127.0.0.1:50051", token: None, run_id: "run-1", rank: 0 };
//! let recorder = MetricsRecorder::new(target, RecorderOptions::default())?;
//! recorder.record(Reading { step: 1.0, name: "loss", value: 2.31 });
//! let delivery = recorder.close();
//! if delivery.undelivered() > 0 {
//!     eprintln!("warning: {delivery}");
//! }
//! # Ok::<(), drove_metrics::RecorderError>(())
//! ```
#![deny(missing_docs)]

mod backoff;
mod error;
mod options;
mod pusher;
mod queue;
mod recorder;

/// The names of the metrics and events a drove run records (from drove-proto,
/// the contract this crate's points travel under).
pub use drove_proto::metric_names;
pub use error::RecorderError;
pub use options::RecorderOptions;
pub use recorder::{Delivery, MetricsRecorder, Reading, RecorderTarget};

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
//! use drove_metrics::{MetricsRecorder, RecorderOptions};
//!
//! let recorder = MetricsRecorder::new("127.0.0.1:50051", None, "run-1", 0, RecorderOptions::default())?;
//! recorder.record(1.0, "loss", 2.31);
//! let delivery = recorder.close();
//! if delivery.undelivered() > 0 {
//!     eprintln!("warning: {delivery}");
//! }
//! # Ok::<(), drove_metrics::RecorderError>(())
//! ```
#![deny(missing_docs)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use drove_control::Authed;
use drove_proto::v1::metrics_client::MetricsClient;
use drove_proto::v1::{MetricPoint, PushRequest};

/// The names of the metrics and events a drove run records (from drove-proto,
/// the contract this crate's points travel under).
pub use drove_proto::metric_names;

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
    /// [`MetricsRecorder::flush`] ran out of time.
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

/// How a [`MetricsRecorder`] buffers, retries and gives up.
#[derive(Clone, Debug)]
pub struct RecorderOptions {
    /// Most points held waiting for the coordinator; past it the oldest are
    /// dropped and counted. At least `batch`.
    pub capacity: usize,
    /// Most points per push.
    pub batch: usize,
    /// How long [`MetricsRecorder::close`] (and drop) waits for the last points.
    pub flush_timeout: Duration,
    /// The first wait after a failed push; it doubles up to `max_backoff`, each
    /// wait shortened by up to a half at random so ranks do not retry in step.
    pub min_backoff: Duration,
    /// The longest wait between retries.
    pub max_backoff: Duration,
    /// One push's deadline (connecting included).
    pub push_timeout: Duration,
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
        }
    }
}

impl RecorderOptions {
    /// The defaults, overridden by `DROVE_METRICS_CAPACITY` (points) and
    /// `DROVE_METRICS_FLUSH_SECS` (seconds) where set.
    pub fn from_env() -> Result<Self, RecorderError> {
        let mut o = RecorderOptions::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = var("DROVE_METRICS_CAPACITY") {
            o.capacity = v.trim().parse().map_err(|_| RecorderError::Setting {
                name: "DROVE_METRICS_CAPACITY".into(),
                message: format!("must be a whole number of points, found {v:?}"),
            })?;
        }
        if let Some(v) = var("DROVE_METRICS_FLUSH_SECS") {
            let secs: f64 = v.trim().parse().map_err(|_| RecorderError::Setting {
                name: "DROVE_METRICS_FLUSH_SECS".into(),
                message: format!("must be a number of seconds, found {v:?}"),
            })?;
            if !(secs.is_finite() && secs >= 0.0) {
                return Err(RecorderError::Setting {
                    name: "DROVE_METRICS_FLUSH_SECS".into(),
                    message: format!("must be a finite number of seconds of at least 0, found {v:?}"),
                });
            }
            o.flush_timeout = Duration::from_secs_f64(secs);
        }
        o.check()?;
        Ok(o)
    }

    fn check(&self) -> Result<(), RecorderError> {
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

/// What became of the points recorded, as [`MetricsRecorder::close`] or
/// [`MetricsRecorder::delivery`] reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delivery {
    /// The coordinator.
    pub addr: String,
    /// Points recorded.
    pub recorded: u64,
    /// Points the coordinator acknowledged.
    pub delivered: u64,
    /// Of those, points it already held (resent after a lost acknowledgement).
    pub duplicates: u64,
    /// Points dropped because the buffer was full (oldest first).
    pub dropped: u64,
    /// Points still waiting (not acknowledged) when this was taken.
    pub pending: u64,
    /// The last push error, if the last push failed.
    pub last_error: Option<String>,
}

impl Delivery {
    /// Points that did not reach the coordinator: dropped or still waiting.
    pub fn undelivered(&self) -> u64 {
        self.dropped + self.pending
    }
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} metric point(s) delivered to the coordinator at {}",
            self.delivered, self.recorded, self.addr
        )?;
        if self.undelivered() > 0 {
            write!(
                f,
                "; {} not delivered ({} dropped from a full buffer, {} unacknowledged)",
                self.undelivered(),
                self.dropped,
                self.pending
            )?;
        }
        if let Some(e) = &self.last_error {
            write!(f, "; last error: {e}")?;
        }
        Ok(())
    }
}

/// The buffer and the counters, shared with the push thread.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<MetricPoint>,
    /// Points taken by the push thread and not yet acknowledged.
    in_flight: u64,
    recorded: u64,
    delivered: u64,
    duplicates: u64,
    dropped: u64,
    last_error: Option<String>,
    /// No more points: push what is left, then stop.
    closing: bool,
    /// Stop now, whatever is left.
    abandon: bool,
}

impl Queue {
    fn pending(&self) -> u64 {
        self.waiting.len() as u64 + self.in_flight
    }
}

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn wire_rank(rank: usize) -> i32 {
    i32::try_from(rank).unwrap_or(i32::MAX)
}

/// Records metric points of one rank of one run and delivers them to a
/// coordinator from a background thread (see the crate docs).
pub struct MetricsRecorder {
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
    addr: String,
    token: Option<String>,
    run_id: String,
    /// The rank points go under (an elastic member's changes with its world).
    rank: AtomicI32,
    options: RecorderOptions,
}

impl std::fmt::Debug for MetricsRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsRecorder")
            .field("addr", &self.addr)
            .field("run_id", &self.run_id)
            .field("rank", &self.rank.load(Ordering::Relaxed))
            .finish()
    }
}

impl MetricsRecorder {
    /// A recorder for `rank` of `run_id`, delivering to the coordinator at
    /// `addr` (`host:port` or a URL) with `token` if given. Connecting waits for
    /// the first push: a coordinator that is down now is retried later.
    pub fn new(
        addr: &str,
        token: Option<&str>,
        run_id: &str,
        rank: usize,
        options: RecorderOptions,
    ) -> Result<Self, RecorderError> {
        options.check()?;
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), changed: Condvar::new() });
        let pusher = Pusher {
            shared: shared.clone(),
            addr: addr.to_string(),
            token: token.map(str::to_string),
            options: options.clone(),
        };
        let worker = std::thread::Builder::new()
            .name("drove-metrics".into())
            .spawn(move || pusher.run())
            .map_err(RecorderError::Thread)?;
        Ok(MetricsRecorder {
            shared,
            worker: Some(worker),
            addr: addr.to_string(),
            token: token.map(str::to_string),
            run_id: run_id.to_string(),
            rank: AtomicI32::new(wire_rank(rank)),
            options,
        })
    }

    /// Records later points and events as `rank`: an elastic run's member
    /// takes a new rank in each world, and (run, rank, name, step) must stay
    /// one point (within a world ranks are unique, and steps only go on).
    pub fn set_rank(&self, rank: usize) {
        self.rank.store(wire_rank(rank), Ordering::Relaxed);
    }

    /// Records `name = value` at `step`; never blocks on the network.
    pub fn record(&self, step: f64, name: &str, value: f64) {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let point = MetricPoint {
            run_id: self.run_id.clone(),
            rank: self.rank.load(Ordering::Relaxed),
            step,
            name: name.to_string(),
            value,
            wall_time_unix_ms: wall,
        };
        let mut q = self.shared.lock();
        if q.closing {
            return;
        }
        q.recorded += 1;
        while q.pending() >= self.options.capacity as u64 && !q.waiting.is_empty() {
            q.waiting.pop_front();
            q.dropped += 1;
        }
        q.waiting.push_back(point);
        drop(q);
        self.shared.changed.notify_all();
    }

    /// Records an event of the run (e.g. `diversity_alarm`) at once, waiting at
    /// most `timeout`: events are rare and worth knowing about now.
    pub fn event(
        &self,
        step: f64,
        kind: &str,
        message: &str,
        timeout: Duration,
    ) -> Result<(), RecorderError> {
        let err = |message: String| RecorderError::Event { addr: self.addr.clone(), message };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| err(format!("cannot start a runtime: {e}")))?;
        let event = drove_proto::v1::RunEvent {
            run_id: self.run_id.clone(),
            rank: self.rank.load(Ordering::Relaxed),
            step,
            kind: kind.to_string(),
            message: message.to_string(),
            wall_time_unix_ms: 0,
        };
        runtime.block_on(async {
            let call = async {
                let channel = drove_control::Connection::new(&self.addr, self.token.as_deref())
                    .with_tls_ca(std::env::var_os("DROVE_TLS_CA").map(Into::into))
                    .authed()
                    .await
                    .map_err(|e| e.to_string())?;
                MetricsClient::new(channel)
                    .record_event(event)
                    .await
                    .map_err(|s| format!("{} ({:?})", s.message(), s.code()))?;
                Ok::<(), String>(())
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(r) => r.map_err(err),
                Err(_) => Err(err(format!("no answer within {timeout:?}"))),
            }
        })
    }

    /// Where the points stand now.
    pub fn delivery(&self) -> Delivery {
        let q = self.shared.lock();
        Delivery {
            addr: self.addr.clone(),
            recorded: q.recorded,
            delivered: q.delivered,
            duplicates: q.duplicates,
            dropped: q.dropped,
            pending: q.pending(),
            last_error: q.last_error.clone(),
        }
    }

    /// Waits at most `timeout` until every point recorded so far is
    /// acknowledged; returns how many points have been delivered.
    pub fn flush(&self, timeout: Duration) -> Result<u64, RecorderError> {
        let started = Instant::now();
        let target = self.shared.lock().recorded;
        let mut q = self.shared.lock();
        loop {
            // Everything recorded up to `target` is acknowledged or dropped.
            if q.delivered + q.dropped >= target {
                return Ok(q.delivered);
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(RecorderError::NotDelivered {
                    addr: self.addr.clone(),
                    undelivered: q.pending(),
                    waited: started.elapsed(),
                    last_error: q.last_error.clone(),
                });
            }
            q = self.shared.changed.wait_timeout(q, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Stops recording, waits at most [`RecorderOptions::flush_timeout`] for
    /// the points left, and reports what became of them all.
    pub fn close(mut self) -> Delivery {
        self.finish()
    }

    fn finish(&mut self) -> Delivery {
        let Some(worker) = self.worker.take() else { return self.delivery() };
        self.shared.lock().closing = true;
        self.shared.changed.notify_all();
        let flushed = self.flush(self.options.flush_timeout);
        let delivery = self.delivery();
        if flushed.is_ok() {
            let _ = worker.join();
        } else {
            // The thread may be inside a push: it stops after it (bounded by
            // push_timeout) without holding anyone up; the process may exit first.
            self.shared.lock().abandon = true;
            self.shared.changed.notify_all();
        }
        delivery
    }
}

impl Drop for MetricsRecorder {
    fn drop(&mut self) {
        if self.worker.is_some() {
            let delivery = self.finish();
            if delivery.undelivered() > 0 {
                tracing::warn!("{delivery}");
            }
        }
    }
}

/// The push thread: takes batches off the queue and pushes each until the
/// coordinator acknowledges it.
struct Pusher {
    shared: Arc<Shared>,
    addr: String,
    token: Option<String>,
    options: RecorderOptions,
}

impl Pusher {
    fn run(self) {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => {
                self.shared.lock().last_error = Some(format!("cannot start a runtime: {e}"));
                self.shared.changed.notify_all();
                return;
            }
        };
        let mut client: Option<MetricsClient<Authed>> = None;
        let mut jitter = Jitter::new();
        while let Some(batch) = self.next_batch() {
            let n = batch.len() as u64;
            let mut backoff = self.options.min_backoff;
            loop {
                let pushed = runtime.block_on(async {
                    tokio::time::timeout(self.options.push_timeout, self.push(&mut client, batch.clone()))
                        .await
                });
                let error = match pushed {
                    Ok(Ok(duplicates)) => {
                        let mut q = self.shared.lock();
                        q.in_flight = 0;
                        q.delivered += n;
                        q.duplicates += duplicates;
                        q.last_error = None;
                        drop(q);
                        self.shared.changed.notify_all();
                        break;
                    }
                    Ok(Err(e)) => e,
                    Err(_) => format!("no acknowledgement within {:?}", self.options.push_timeout),
                };
                client = None; // a new connection for the retry
                let wait = jitter.shorten(backoff);
                tracing::debug!(addr = %self.addr, "metrics push failed ({error}); retrying in {wait:?}");
                let mut q = self.shared.lock();
                q.last_error = Some(error);
                self.shared.changed.notify_all();
                let until = Instant::now() + wait;
                while !q.abandon {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    q = self.shared.changed.wait_timeout(q, left).unwrap_or_else(|e| e.into_inner()).0;
                }
                if q.abandon {
                    return;
                }
                backoff = (backoff * 2).min(self.options.max_backoff);
            }
        }
    }

    /// The next batch, waiting for points; `None` once closing and empty, or abandoned.
    fn next_batch(&self) -> Option<Vec<MetricPoint>> {
        let mut q = self.shared.lock();
        loop {
            if q.abandon {
                return None;
            }
            if !q.waiting.is_empty() {
                let n = q.waiting.len().min(self.options.batch);
                let batch: Vec<MetricPoint> = q.waiting.drain(..n).collect();
                q.in_flight = batch.len() as u64;
                return Some(batch);
            }
            if q.closing {
                return None;
            }
            q = self.shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// One push of `batch`; returns how many of its points the coordinator
    /// already held.
    async fn push(
        &self,
        client: &mut Option<MetricsClient<Authed>>,
        batch: Vec<MetricPoint>,
    ) -> Result<u64, String> {
        if client.is_none() {
            let channel = drove_control::Connection::new(&self.addr, self.token.as_deref())
                .with_tls_ca(std::env::var_os("DROVE_TLS_CA").map(Into::into))
                .authed()
                .await
                .map_err(|e| e.to_string())?;
            *client = Some(MetricsClient::new(channel));
        }
        let c = client.as_mut().expect("connected above");
        let n = batch.len() as u64;
        let stream = tokio_stream_once(PushRequest { points: batch });
        let mut acks =
            c.push(stream).await.map_err(|s| format!("{} ({:?})", s.message(), s.code()))?.into_inner();
        let (mut stored, mut duplicates) = (0, 0);
        while let Some(ack) = acks.message().await.map_err(|s| format!("{} ({:?})", s.message(), s.code()))? {
            stored = ack.stored;
            duplicates = ack.duplicates;
        }
        if stored != n {
            return Err(format!("the coordinator acknowledged {stored} of {n} points"));
        }
        Ok(duplicates)
    }
}

/// A one-message request stream.
fn tokio_stream_once(
    request: PushRequest,
) -> impl tonic::codegen::tokio_stream::Stream<Item = PushRequest> + Send + 'static {
    tonic::codegen::tokio_stream::iter(std::iter::once(request))
}

/// Random shortening of backoff waits (xorshift, seeded by time and process).
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Jitter((t ^ (u64::from(std::process::id()) << 32)) | 1)
    }

    /// `d` times a random factor in [0.5, 1).
    fn shorten(&mut self, d: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let unit = (self.0 >> 11) as f64 / (1u64 << 53) as f64;
        d.mul_f64(0.5 + unit / 2.0)
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

    #[test]
    fn jitter_stays_within_half_and_whole() {
        let mut j = Jitter::new();
        let d = Duration::from_secs(4);
        let waits: Vec<Duration> = (0..1000).map(|_| j.shorten(d)).collect();
        assert!(waits.iter().all(|w| *w >= d / 2 && *w < d), "{waits:?}");
        assert!(waits.iter().any(|w| *w != waits[0]), "jitter varies");
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_and_counts_them() {
        // Nothing listens on port 1: every push fails, so nothing leaves the buffer.
        let options = RecorderOptions {
            capacity: 4,
            batch: 2,
            flush_timeout: Duration::from_millis(50),
            min_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            ..RecorderOptions::default()
        };
        let r = MetricsRecorder::new("127.0.0.1:1", None, "run", 0, options).unwrap();
        for step in 0..10 {
            r.record(step as f64, "loss", 1.0);
        }
        let d = r.close();
        assert_eq!(d.recorded, 10);
        assert_eq!(d.delivered, 0);
        assert_eq!(d.dropped + d.pending, 10, "{d:?}");
        assert!(d.pending <= 4, "at most the capacity waits: {d:?}");
        assert!(d.dropped >= 6, "{d:?}");
        assert!(d.to_string().contains("not delivered"), "{d}");
    }
}

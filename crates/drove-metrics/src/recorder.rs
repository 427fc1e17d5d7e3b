//! [`MetricsRecorder`], which training code records points through, and
//! [`Delivery`], what became of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use drove_proto::v1::MetricPoint;

use crate::pusher::{Pusher, send_event};
use crate::queue::Shared;
use crate::{RecorderError, RecorderOptions};

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

fn wire_rank(rank: usize) -> i32 {
    i32::try_from(rank).unwrap_or(i32::MAX)
}

/// Where a [`MetricsRecorder`]'s points go and whose they are, by name (the
/// Python `Metrics(address, *, run_id, rank, token=None)`): an address, a
/// token and a run id are three strings that would swap silently by
/// position. No default: every recorder names its coordinator, run and rank.
#[derive(Clone, Copy)]
pub struct RecorderTarget<'a> {
    /// The coordinator, `host:port` or a URL.
    pub address: &'a str,
    /// The run's token, if the coordinator asks for one.
    pub token: Option<&'a str>,
    /// The run the points belong to.
    pub run_id: &'a str,
    /// The rank recording (see [`MetricsRecorder::set_rank`] for an elastic
    /// member's next world).
    pub rank: usize,
}

/// One metric reading, by name: `name = value` at `step`. Step and value are
/// both `f64` (the wire's types), so they are named rather than placed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading<'a> {
    /// The training step (or any increasing position: a fraction of an epoch).
    pub step: f64,
    /// The metric, e.g. one of [`metric_names`](crate::metric_names).
    pub name: &'a str,
    /// Its value.
    pub value: f64,
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
    /// A recorder for `target`'s rank of its run, delivering to its
    /// coordinator with its token if given. Connecting waits for the first
    /// push: a coordinator that is down now is retried later.
    pub fn new(target: RecorderTarget<'_>, options: RecorderOptions) -> Result<Self, RecorderError> {
        let RecorderTarget { address: addr, token, run_id, rank } = target;
        options.check()?;
        let shared = Arc::new(Shared::new());
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
    pub fn record(&self, reading: Reading<'_>) {
        let Reading { step, name, value } = reading;
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
        q.push(point, self.options.capacity);
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
        let event = drove_proto::v1::RunEvent {
            run_id: self.run_id.clone(),
            rank: self.rank.load(Ordering::Relaxed),
            step,
            kind: kind.to_string(),
            message: message.to_string(),
            wall_time_unix_ms: 0,
        };
        send_event(&self.addr, self.token.as_deref(), self.options.tls_ca.clone(), event, timeout)
            .map_err(|message| RecorderError::Event { addr: self.addr.clone(), message })
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let r = MetricsRecorder::new(
            RecorderTarget { address: "127.0.0.1:1", token: None, run_id: "run", rank: 0 },
            options,
        )
        .unwrap();
        for step in 0..10 {
            r.record(Reading { step: step as f64, name: "loss", value: 1.0 });
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

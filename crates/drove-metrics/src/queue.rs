//! The bounded buffer of points waiting for the coordinator and the delivery
//! counters, shared by the recorder and the push thread under one lock.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use drove_proto::v1::MetricPoint;

/// The buffer and the counters, shared with the push thread.
#[derive(Default)]
pub(crate) struct Queue {
    /// Points recorded and not yet taken by the push thread, oldest first.
    pub waiting: VecDeque<MetricPoint>,
    /// Points taken by the push thread and not yet acknowledged.
    pub in_flight: u64,
    /// Points recorded.
    pub recorded: u64,
    /// Points the coordinator acknowledged.
    pub delivered: u64,
    /// Of those, points it already held.
    pub duplicates: u64,
    /// Points dropped from a full buffer.
    pub dropped: u64,
    /// The last push error, until a push succeeds.
    pub last_error: Option<String>,
    /// No more points: push what is left, then stop.
    pub closing: bool,
    /// Stop now, whatever is left.
    pub abandon: bool,
}

impl Queue {
    /// Points not acknowledged: waiting or in flight.
    pub fn pending(&self) -> u64 {
        self.waiting.len() as u64 + self.in_flight
    }

    /// Counts `point` as recorded and buffers it, dropping (and counting) the
    /// oldest waiting points while `capacity` points are pending.
    pub fn push(&mut self, point: MetricPoint, capacity: usize) {
        self.recorded += 1;
        while self.pending() >= capacity as u64 && !self.waiting.is_empty() {
            self.waiting.pop_front();
            self.dropped += 1;
        }
        self.waiting.push_back(point);
    }
}

/// The queue and the condition variable that signals every change to it.
pub(crate) struct Shared {
    /// The buffer and counters.
    pub queue: Mutex<Queue>,
    /// Notified after each change of the queue.
    pub changed: Condvar,
}

impl Shared {
    /// A new, empty queue.
    pub fn new() -> Self {
        Shared { queue: Mutex::new(Queue::default()), changed: Condvar::new() }
    }

    /// The queue, locked (a poisoned lock is taken as it is).
    pub fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

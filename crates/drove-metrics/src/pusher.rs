//! The push thread: batches off the queue, pushed over gRPC to the
//! coordinator's `Metrics.Push` until acknowledged, on a new connection after
//! each failure; and the one-off `RecordEvent` call. The only gRPC of the crate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use drove_control::Authed;
use drove_proto::v1::metrics_client::MetricsClient;
use drove_proto::v1::{MetricPoint, PushRequest, RunEvent};

use crate::RecorderOptions;
use crate::backoff::Backoff;
use crate::queue::Shared;

/// The push thread: takes batches off the queue and pushes each until the
/// coordinator acknowledges it.
pub(crate) struct Pusher {
    /// The queue it takes batches from.
    pub shared: Arc<Shared>,
    /// The coordinator.
    pub addr: String,
    /// The coordinator's token, if it needs one.
    pub token: Option<String>,
    /// Batch size, deadlines and backoff.
    pub options: RecorderOptions,
}

impl Pusher {
    /// Pushes batches until the queue is closed and empty, or abandoned.
    pub fn run(self) {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(r) => r,
            Err(e) => {
                self.shared.lock().last_error = Some(format!("cannot start a runtime: {e}"));
                self.shared.changed.notify_all();
                return;
            }
        };
        let mut client: Option<MetricsClient<Authed>> = None;
        let mut backoff = Backoff::new(self.options.min_backoff, self.options.max_backoff);
        while let Some(batch) = self.next_batch() {
            let n = batch.len() as u64;
            backoff.reset();
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
                let wait = backoff.next_wait();
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
                .with_tls_ca(self.options.tls_ca.clone())
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

/// Records `event` on the coordinator at `addr` over a connection of its own,
/// waiting at most `timeout`; the error says why not.
pub(crate) fn send_event(
    addr: &str,
    token: Option<&str>,
    tls_ca: Option<std::path::PathBuf>,
    event: RunEvent,
    timeout: Duration,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(async {
        let call = async {
            let channel = drove_control::Connection::new(addr, token)
                .with_tls_ca(tls_ca)
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
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {timeout:?}")),
        }
    })
}

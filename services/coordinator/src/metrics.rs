//! The Metrics service: batches of points stored in one transaction each and
//! acknowledged after commit; queries with aggregation across ranks; watchers
//! that get the stored points, then every new one.

use std::pin::Pin;

use drove_proto::v1::metrics_server::Metrics;
use drove_proto::v1::{
    Aggregation, ListRunsRequest, ListRunsResponse, MetricPoint, PushAck, PushRequest, QueryPoint,
    QueryRequest, QueryResponse, RecordEventResponse, RunEvent, RunInfo, WatchRequest,
};
use futures::Stream;
use tokio::sync::broadcast;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use crate::store::{Agg, EventRow, Filter, PointRow, Store, now_ms};
use crate::validate::{check_run_id, internal};

/// Shared metrics state.
#[derive(Clone)]
pub struct MetricsService {
    store: Store,
    counters: std::sync::Arc<crate::prometheus::Counters>,
    new_points: broadcast::Sender<std::sync::Arc<Vec<PointRow>>>,
    closing: tokio::sync::watch::Receiver<bool>,
}

impl MetricsService {
    /// Points in `store`; watch streams end when `closing` turns true.
    pub fn new(store: Store, closing: tokio::sync::watch::Receiver<bool>) -> Self {
        MetricsService {
            store,
            counters: Default::default(),
            new_points: broadcast::channel(1024).0,
            closing,
        }
    }

    /// The counters this service bumps (points ingested, pushes), for `/metrics`.
    pub fn counters(&self) -> std::sync::Arc<crate::prometheus::Counters> {
        self.counters.clone()
    }
}

fn to_point(p: &MetricPoint, index: usize, arrival: i64) -> Result<PointRow, Status> {
    let bad = |field: &str, what: String| Status::invalid_argument(format!("points[{index}].{field} {what}"));
    if p.run_id.is_empty() {
        return Err(bad("run_id", "must not be empty".into()));
    }
    check_run_id(&p.run_id, &format!("points[{index}].run_id"))?;
    if p.rank < 0 {
        return Err(bad("rank", format!("must be >= 0, found {}", p.rank)));
    }
    if !p.step.is_finite() || p.step < 0.0 {
        return Err(bad("step", format!("must be a finite number >= 0, found {}", p.step)));
    }
    if p.name.is_empty() {
        return Err(bad("name", "must not be empty".into()));
    }
    if !p.value.is_finite() {
        return Err(bad("value", format!("must be finite, found {}", p.value)));
    }
    Ok(PointRow {
        id: 0,
        run_id: p.run_id.clone(),
        rank: p.rank,
        step: p.step,
        name: p.name.clone(),
        value: p.value,
        wall_ms: if p.wall_time_unix_ms == 0 { arrival } else { p.wall_time_unix_ms },
    })
}

fn to_proto(p: &PointRow) -> MetricPoint {
    MetricPoint {
        run_id: p.run_id.clone(),
        rank: p.rank,
        step: p.step,
        name: p.name.clone(),
        value: p.value,
        wall_time_unix_ms: p.wall_ms,
    }
}

fn filter_of(
    run_id: &str,
    name: &str,
    min_step: Option<f64>,
    max_step: Option<f64>,
) -> Result<Filter, Status> {
    check_run_id(run_id, "run_id")?;
    for (field, v) in [("min_step", min_step), ("max_step", max_step)] {
        if v.is_some_and(|s| s.is_nan()) {
            return Err(Status::invalid_argument(format!("{field} must be a number, found NaN")));
        }
    }
    Ok(Filter {
        run_id: run_id.to_string(),
        name: (!name.is_empty()).then(|| name.to_string()),
        min_step,
        max_step,
        after_id: None,
    })
}

type PushStream = Pin<Box<dyn Stream<Item = Result<PushAck, Status>> + Send>>;
type WatchStream = Pin<Box<dyn Stream<Item = Result<MetricPoint, Status>> + Send>>;

#[tonic::async_trait]
impl Metrics for MetricsService {
    type PushStream = PushStream;

    async fn push(
        &self,
        request: Request<Streaming<PushRequest>>,
    ) -> Result<Response<Self::PushStream>, Status> {
        let mut input = request.into_inner();
        crate::prometheus::Counters::add(&self.counters.pushes, 1);
        let counters = self.counters.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<PushAck, Status>>(16);
        let store = self.store.clone();
        let new_points = self.new_points.clone();
        tokio::spawn(async move {
            let (mut stored, mut duplicates) = (0u64, 0u64);
            while let Some(batch) = input.next().await {
                let batch = match batch {
                    Ok(b) => b,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                let arrival = now_ms();
                let points: Vec<_> =
                    match batch.points.iter().enumerate().map(|(i, p)| to_point(p, i, arrival)).collect() {
                        Ok(points) => points,
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                    };
                let sent = points.len() as u64;
                let store = store.clone();
                let feed = new_points.clone();
                let counters = counters.clone();
                let result = tokio::task::spawn_blocking(move || {
                    store.insert_points_then(points, |stored| {
                        // Counted before the store's lock is let go: a scrape
                        // that sees the points sees them counted.
                        crate::prometheus::Counters::add(&counters.points_ingested, stored.len() as u64);
                        if !stored.is_empty() {
                            let _ = feed.send(std::sync::Arc::new(stored.to_vec()));
                        }
                    })
                })
                .await;
                let points = match result {
                    Ok(Ok(points)) => points,
                    Ok(Err(e)) => {
                        let _ = tx.send(Err(internal(e))).await;
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(internal(e))).await;
                        return;
                    }
                };
                stored += sent;
                duplicates += sent - points.len() as u64;
                if tx.send(Ok(PushAck { stored, duplicates })).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn record_event(
        &self,
        request: Request<RunEvent>,
    ) -> Result<Response<RecordEventResponse>, Status> {
        let e = request.into_inner();
        check_run_id(&e.run_id, "run_id")?;
        if e.rank < 0 {
            return Err(Status::invalid_argument(format!("rank must be >= 0, found {}", e.rank)));
        }
        if !e.step.is_finite() || e.step < 0.0 {
            return Err(Status::invalid_argument(format!(
                "step must be a finite number >= 0, found {}",
                e.step
            )));
        }
        if e.kind.is_empty() || e.kind.len() > 64 {
            return Err(Status::invalid_argument(format!(
                "kind must be 1 to 64 bytes, found {}",
                e.kind.len()
            )));
        }
        if e.message.len() > 16 << 10 {
            return Err(Status::invalid_argument(format!(
                "message must be at most 16 KiB, found {} bytes",
                e.message.len()
            )));
        }
        let row = EventRow {
            run_id: e.run_id,
            rank: e.rank,
            step: e.step,
            kind: e.kind,
            message: e.message,
            wall_ms: if e.wall_time_unix_ms == 0 { now_ms() } else { e.wall_time_unix_ms },
        };
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.add_event(&row))
            .await
            .map_err(internal)?
            .map_err(internal)?;
        Ok(Response::new(RecordEventResponse {}))
    }

    async fn query(&self, request: Request<QueryRequest>) -> Result<Response<QueryResponse>, Status> {
        let req = request.into_inner();
        let filter = filter_of(&req.run_id, &req.name, req.min_step, req.max_step)?;
        let agg = match Aggregation::try_from(req.aggregation) {
            Ok(Aggregation::Unspecified | Aggregation::Raw) => None,
            Ok(Aggregation::Mean) => Some(Agg::Mean),
            Ok(Aggregation::Min) => Some(Agg::Min),
            Ok(Aggregation::Max) => Some(Agg::Max),
            Ok(Aggregation::Sum) => Some(Agg::Sum),
            Ok(Aggregation::Count) => Some(Agg::Count),
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "aggregation {} is not a known value",
                    req.aggregation
                )));
            }
        };
        let store = self.store.clone();
        let points = tokio::task::spawn_blocking(move || match agg {
            None => store.points(&filter, false).map(|ps| {
                ps.iter()
                    .map(|p| QueryPoint {
                        name: p.name.clone(),
                        step: p.step,
                        rank: p.rank,
                        value: p.value,
                        count: 1,
                        wall_time_unix_ms: p.wall_ms,
                    })
                    .collect::<Vec<_>>()
            }),
            Some(agg) => store.aggregate(&filter, agg).map(|rows| {
                rows.into_iter()
                    .map(|r| QueryPoint {
                        name: r.name,
                        step: r.step,
                        rank: -1,
                        value: r.value,
                        count: r.count,
                        wall_time_unix_ms: r.wall_ms,
                    })
                    .collect()
            }),
        })
        .await
        .map_err(internal)?
        .map_err(internal)?;
        Ok(Response::new(QueryResponse { points }))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let req = request.into_inner();
        let filter = filter_of(&req.run_id, &req.name, None, None)?;
        // Subscribe before reading what is stored, so nothing falls in between.
        let mut live = self.new_points.subscribe();
        let mut closing = self.closing.clone();
        let store = self.store.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<MetricPoint, Status>>(256);
        tokio::spawn(async move {
            let mut last_id = 0i64;
            let catch_up = |after: i64| {
                let store = store.clone();
                let mut f = filter.clone();
                f.after_id = Some(after);
                tokio::task::spawn_blocking(move || store.points(&f, true))
            };
            let mut pending = Some(catch_up(0));
            loop {
                if let Some(job) = pending.take() {
                    match job.await {
                        Ok(Ok(points)) => {
                            for p in points {
                                last_id = last_id.max(p.id);
                                if tx.send(Ok(to_proto(&p))).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Ok(Err(e)) => {
                            let _ = tx.send(Err(internal(e))).await;
                            return;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(internal(e))).await;
                            return;
                        }
                    }
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = async { drop(closing.wait_for(|c| *c).await) } => return,
                    msg = live.recv() => match msg {
                        Ok(batch) => {
                            for p in batch.iter() {
                                let wanted = p.id > last_id
                                    && p.run_id == filter.run_id
                                    && filter.name.as_ref().is_none_or(|n| *n == p.name);
                                if wanted {
                                    last_id = p.id;
                                    if tx.send(Ok(to_proto(p))).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                        // Fell behind the live feed: read what was missed from the store.
                        Err(broadcast::error::RecvError::Lagged(_)) => pending = Some(catch_up(last_id)),
                        Err(broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn list_runs(
        &self,
        _request: Request<ListRunsRequest>,
    ) -> Result<Response<ListRunsResponse>, Status> {
        let store = self.store.clone();
        let (runs, mut events) = tokio::task::spawn_blocking(move || {
            Ok::<_, crate::store::StoreError>((store.runs()?, store.events()?))
        })
        .await
        .map_err(internal)?
        .map_err(internal)?;
        let runs = runs
            .into_iter()
            .map(|r| RunInfo {
                state: r.listed_state().into(),
                events: events
                    .remove(&r.run_id)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|e| RunEvent {
                        run_id: e.run_id,
                        rank: e.rank,
                        step: e.step,
                        kind: e.kind,
                        message: e.message,
                        wall_time_unix_ms: e.wall_ms,
                    })
                    .collect(),
                run_id: r.run_id,
                world_size: r.world_size,
                joined: r.joined,
                points: r.points,
                created_unix_ms: r.created_ms,
                updated_unix_ms: r.updated_ms,
                restarts: r.restarts,
            })
            .collect();
        Ok(Response::new(ListRunsResponse { runs }))
    }
}

//! The coordinator suite's load: every call through drove-control's thin
//! call functions (connected by drove-launch).

use std::sync::{Arc, Barrier};
use std::time::Instant;

use drove_control::{Clients, QueryError, queries};
use drove_proto::v1::{BlobHeader, FetchRequest, JoinRequest, MetricPoint, PublishChunk, PushRequest};
use sha2::{Digest, Sha256};

use super::report::{IngestReport, RendezvousReport};
use super::shared::{BATCH, BLOB, CHUNK, METRICS_RUN, RENDEZVOUS_RUN, hex};
use crate::BenchError;
use crate::error::Doing as _;

/// A failed call as an error naming its gRPC code.
fn status(e: QueryError) -> BenchError {
    BenchError::Status(e.to_string())
}

/// `Err(Check(message))` unless `ok`.
fn ensure(ok: bool, message: impl FnOnce() -> String) -> Result<(), BenchError> {
    if ok { Ok(()) } else { Err(BenchError::Check(message())) }
}

async fn connect(addr: &str) -> Result<Clients, BenchError> {
    Ok(drove_launch::coordinator_clients(addr, None).await?)
}

async fn connect_all(addr: &str, n: usize) -> Result<Vec<Clients>, drove_launch::LaunchError> {
    futures::future::try_join_all((0..n).map(|_| drove_launch::coordinator_clients(addr, None))).await
}

/// `workers` concurrent Join calls into one run, each on its own connection.
pub(super) async fn rendezvous(addr: &str, workers: usize) -> Result<RendezvousReport, BenchError> {
    let t = Instant::now();
    let clients = connect_all(addr, workers).await.doing("connecting the workers")?;
    let connect_seconds = t.elapsed().as_secs_f64();
    let start = Instant::now();
    let joins: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            tokio::spawn(async move {
                queries::join(
                    &mut c,
                    JoinRequest {
                        run_id: RENDEZVOUS_RUN.into(),
                        world_size: workers as i32,
                        address: format!("127.0.0.1:{}", 10_000 + i),
                        host: "bench".into(),
                        requested_rank: -1,
                        timeout_ms: 120_000,
                        restart_count: 0,
                        ..Default::default()
                    },
                )
                .await
            })
        })
        .collect();
    let responses = futures::future::join_all(joins).await;
    let seconds = start.elapsed().as_secs_f64();
    let mut seen = vec![false; workers];
    for r in responses {
        let resp = r.doing("a join task panicked")?.map_err(status).doing("joining")?;
        let peers = resp.peers.len();
        ensure(peers == workers, || format!("a join returned {peers} peers, expected {workers}"))?;
        let rank = usize::try_from(resp.rank).ok().filter(|&r| r < workers);
        let rank = rank.ok_or_else(|| BenchError::Check(format!("a join returned rank {}", resp.rank)))?;
        ensure(!seen[rank], || format!("rank {rank} was handed out twice"))?;
        seen[rank] = true;
    }
    Ok(RendezvousReport {
        workers,
        connect_seconds,
        seconds,
        joins_per_s: workers as f64 / seconds.max(1e-12),
    })
}

fn batch(rank: usize, from: usize, to: usize) -> PushRequest {
    PushRequest {
        points: (from..to)
            .map(|i| MetricPoint {
                run_id: METRICS_RUN.into(),
                rank: rank as i32,
                step: i as f64,
                name: drove_proto::metric_names::LOSS.into(),
                value: 1.0 / (1.0 + i as f64),
                wall_time_unix_ms: 0,
            })
            .collect(),
    }
}

/// One Push stream of `n` points as rank `rank`, until every point is acknowledged.
async fn push(mut c: Clients, rank: usize, n: usize) -> Result<(), BenchError> {
    let batches = futures::stream::iter(
        (0..n.div_ceil(BATCH)).map(move |b| batch(rank, b * BATCH, ((b + 1) * BATCH).min(n))),
    );
    let stored = queries::push(&mut c, batches).await.map_err(status)?;
    ensure(stored == n as u64, || format!("stream {rank}: {stored} of {n} points acknowledged"))
}

/// `streams` concurrent Push streams (one rank each) of `points` in all.
pub(super) async fn ingest(addr: &str, streams: usize, points: usize) -> Result<IngestReport, BenchError> {
    let clients = connect_all(addr, streams).await.doing("connecting the metric streams")?;
    let start = Instant::now();
    let pushes: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(rank, c)| {
            // Stream `rank` carries points/streams, plus one of the remainder.
            let n = points / streams + usize::from(rank < points % streams);
            tokio::spawn(push(c, rank, n))
        })
        .collect();
    for r in futures::future::join_all(pushes).await {
        r.doing("a push task panicked")??;
    }
    let seconds = start.elapsed().as_secs_f64();
    // Every acknowledged point is in the store.
    let runs = queries::list_runs(&drove_launch::connection(addr, None)).await.map_err(status)?;
    let stored = runs.iter().find(|r| r.run_id == METRICS_RUN).map_or(0, |r| r.points);
    ensure(stored == points as u64, || format!("the store holds {stored} of {points} points"))?;
    Ok(IngestReport {
        streams,
        points,
        batch: BATCH,
        seconds,
        points_per_s: points as f64 / seconds.max(1e-12),
    })
}

/// Publishes `blob` in [`CHUNK`]s with its sha256; returns the seconds it took.
pub(super) async fn publish(addr: &str, blob: prost::bytes::Bytes, sha256: &str) -> Result<f64, BenchError> {
    let mut c = connect(addr).await?;
    let size = blob.len();
    let header = BlobHeader { name: BLOB.into(), size: size as u64, sha256: sha256.to_string() };
    let chunks = futures::stream::iter((0..size.div_ceil(CHUNK)).map(move |i| PublishChunk {
        header: (i == 0).then(|| header.clone()),
        data: blob.slice(i * CHUNK..((i + 1) * CHUNK).min(size)),
    }));
    let start = Instant::now();
    let info = queries::publish(&mut c, chunks).await.map_err(status).doing("publishing the blob")?;
    let seconds = start.elapsed().as_secs_f64();
    ensure(info.size == size as u64 && info.sha256 == sha256, || format!("the coordinator stored {info:?}"))?;
    Ok(seconds)
}

/// One fetcher: its own thread and connection; with `verify`, hashing as the
/// chunks arrive (sha256 runs at about 1 GB/s on one core here, so the transfer
/// itself is timed in a second round that only counts bytes).
/// Returns its seconds (from the common start to its last byte).
pub(super) fn fetch(
    addr: &str,
    size: usize,
    sha256: &str,
    start: &Arc<Barrier>,
    verify: bool,
) -> Result<f64, BenchError> {
    let rt =
        tokio::runtime::Builder::new_current_thread().enable_all().build().doing("a fetcher's runtime")?;
    let connected = rt.block_on(connect(addr));
    start.wait();
    let mut c = connected?;
    rt.block_on(async {
        let t = Instant::now();
        let request = FetchRequest { name: BLOB.into(), chunk_bytes: CHUNK as u32 };
        let mut stream = queries::fetch(&mut c, request).await.map_err(status)?;
        let mut hasher = Sha256::new();
        let mut received = 0usize;
        let mut declared = None;
        while let Some(chunk) = stream.next().await.map_err(status)? {
            if let Some(info) = chunk.info {
                declared = Some(info.sha256);
            }
            received += chunk.data.len();
            if verify {
                hasher.update(&chunk.data);
            }
        }
        let seconds = t.elapsed().as_secs_f64();
        ensure(received == size, || format!("fetched {received} of {size} bytes"))?;
        ensure(declared.as_deref() == Some(sha256), || {
            format!("the first chunk declared sha256 {declared:?}")
        })?;
        if verify {
            let got = hex(&hasher.finalize());
            ensure(got == sha256, || format!("the fetched bytes hash to {got}, expected {sha256}"))?;
        }
        Ok(seconds)
    })
}

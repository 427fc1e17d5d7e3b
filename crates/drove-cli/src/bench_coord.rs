//! `drove bench coordinator`: starts a coordinator in-process (loopback, temporary
//! store) and measures its three services the way a job uses them:
//!
//! - rendezvous: `workers` concurrent Join calls into one run, each on its own
//!   connection, from the first call to the last response;
//! - metrics ingest: `streams` concurrent Push streams (one rank each) of
//!   1000-point batches, until every point is acknowledged (= persisted);
//! - blob: publishing a `blob-mib` MiB blob of pseudo-random bytes in 1 MiB
//!   chunks with its sha256, then `fetchers` concurrent Fetch streams, each
//!   hashing what it receives and checking it against the published sha256.
//!
//! Baselines from the same run (sha256 of the blob in memory, a memory copy) let
//! the figures be quoted as ratios. The blob is generated once and streamed from;
//! fetchers hash incrementally and keep nothing.

use std::hint::black_box;
use std::io::IsTerminal as _;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use clap::Args;
use drove_proto::client::Clients;
use drove_proto::v1::{
    BlobHeader, FetchRequest, JoinRequest, ListRunsRequest, MetricPoint, PublishChunk, PushRequest,
};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::bench::Machine;
use crate::control::{self, status_error};
use crate::parse;

const BATCH: usize = 1000;
const CHUNK: usize = 1 << 20;
const RENDEZVOUS_RUN: &str = "bench-rendezvous";
const METRICS_RUN: &str = "bench-metrics";
const BLOB: &str = "bench/blob";

/// Settings of `drove bench coordinator`.
#[derive(Debug, Args)]
pub struct CoordinatorArgs {
    /// Workers joining one run concurrently.
    #[arg(long, default_value_t = 256, value_name = "N", value_parser = workers)]
    workers: usize,
    /// Concurrent metric Push streams (one rank each).
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = streams)]
    streams: usize,
    /// Metric points pushed in all, in batches of 1000.
    #[arg(long, default_value_t = 2_000_000, value_name = "N", value_parser = points)]
    points: usize,
    /// Size of the blob published and fetched, in MiB.
    #[arg(long, default_value_t = 1024, value_name = "MIB", value_parser = blob_mib)]
    blob_mib: usize,
    /// Concurrent Fetch streams of the blob.
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = fetchers)]
    fetchers: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn workers(s: &str) -> Result<usize, String> {
    let n = parse::at_least(s, 1, "workers", " worker")?;
    if n > 4096 {
        Err(format!("workers must be at most 4096 (one connection each), found {n}"))
    } else {
        Ok(n)
    }
}

fn streams(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "streams", " stream")
}

fn points(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "points", " point")
}

fn blob_mib(s: &str) -> Result<usize, String> {
    let n = parse::at_least(s, 1, "blob-mib", " MiB")?;
    if n > 64 << 10 { Err(format!("blob-mib must be at most 65536 (64 GiB), found {n}")) } else { Ok(n) }
}

fn fetchers(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "fetchers", " fetcher")
}

#[derive(Debug, Serialize)]
struct Report {
    machine: Machine,
    rendezvous: RendezvousReport,
    metrics_ingest: IngestReport,
    blob: BlobReport,
    baseline: Baseline,
    ratios: Ratios,
}

#[derive(Debug, Serialize)]
struct RendezvousReport {
    workers: usize,
    connect_seconds: f64,
    seconds: f64,
    joins_per_s: f64,
}

#[derive(Debug, Serialize)]
struct IngestReport {
    streams: usize,
    points: usize,
    batch: usize,
    seconds: f64,
    points_per_s: f64,
}

#[derive(Debug, Serialize)]
struct BlobReport {
    bytes: usize,
    chunk_bytes: usize,
    sha256: String,
    publish_seconds: f64,
    publish_gbps: f64,
    fetchers: usize,
    fetch_wall_seconds: f64,
    fetch_gbps_min: f64,
    fetch_gbps_mean: f64,
    fetch_gbps_aggregate: f64,
    /// Mean per-fetcher rate of the first round, which hashed every byte.
    fetch_verified_gbps_mean: f64,
    verified: bool,
}

#[derive(Debug, Serialize)]
struct Baseline {
    sha256_seconds: f64,
    sha256_gbps: f64,
    memcpy_gbps: f64,
    memcpy_buffer_bytes: usize,
}

#[derive(Debug, Serialize)]
struct Ratios {
    publish_vs_sha256: f64,
    fetch_mean_vs_sha256: f64,
    fetch_mean_vs_memcpy: f64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-12) / 1e9
}

/// `bytes` pseudo-random bytes (splitmix64).
fn pseudo_random(bytes: usize) -> Vec<u8> {
    let mut blob = vec![0u8; bytes];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ bytes as u64;
    for word in blob.chunks_mut(8) {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        word.copy_from_slice(&z.to_le_bytes()[..word.len()]);
    }
    blob
}

/// Median seconds of copying `blob` through a buffer of at most 64 MiB (so the
/// baseline costs no second copy of the blob), over three passes.
fn memcpy_seconds(blob: &[u8]) -> (f64, usize) {
    let buffer = blob.len().min(64 << 20);
    let mut dst = vec![0u8; buffer];
    dst.copy_from_slice(&blob[..buffer]); // fault the pages in
    let mut times: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            for piece in blob.chunks(buffer) {
                dst[..piece.len()].copy_from_slice(black_box(piece));
                black_box(&mut dst);
            }
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[1], buffer)
}

/// Lets the process hold one connection per worker (both ends are in it).
fn raise_open_files(wanted: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < wanted as libc::rlim_t {
            lim.rlim_cur = (wanted as libc::rlim_t).min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

async fn connect_all(addr: &str, n: usize) -> anyhow::Result<Vec<Clients>> {
    let connects = (0..n).map(|_| control::connect(addr, None));
    futures::future::try_join_all(connects).await
}

async fn bench_rendezvous(addr: &str, workers: usize) -> anyhow::Result<RendezvousReport> {
    let t = Instant::now();
    let clients = connect_all(addr, workers).await.context("connecting the workers")?;
    let connect_seconds = t.elapsed().as_secs_f64();
    let start = Instant::now();
    let joins: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            tokio::spawn(async move {
                c.rendezvous
                    .join(JoinRequest {
                        run_id: RENDEZVOUS_RUN.into(),
                        world_size: workers as i32,
                        address: format!("127.0.0.1:{}", 10_000 + i),
                        host: "bench".into(),
                        requested_rank: -1,
                        timeout_ms: 120_000,
                        restart_count: 0,
                        ..Default::default()
                    })
                    .await
                    .map(tonic::Response::into_inner)
            })
        })
        .collect();
    let responses = futures::future::join_all(joins).await;
    let seconds = start.elapsed().as_secs_f64();
    let mut seen = vec![false; workers];
    for r in responses {
        let resp = r.context("a join task panicked")?.map_err(status_error).context("joining")?;
        ensure!(
            resp.peers.len() == workers,
            "a join returned {} peers, expected {workers}",
            resp.peers.len()
        );
        let rank = usize::try_from(resp.rank).ok().filter(|&r| r < workers);
        let rank = rank.ok_or_else(|| anyhow!("a join returned rank {}", resp.rank))?;
        ensure!(!seen[rank], "rank {rank} was handed out twice");
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

async fn bench_ingest(addr: &str, streams: usize, points: usize) -> anyhow::Result<IngestReport> {
    let clients = connect_all(addr, streams).await.context("connecting the metric streams")?;
    let start = Instant::now();
    let pushes: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(rank, mut c)| {
            // Stream `rank` carries points/streams, plus one of the remainder.
            let n = points / streams + usize::from(rank < points % streams);
            tokio::spawn(async move {
                let batches = futures::stream::iter(
                    (0..n.div_ceil(BATCH)).map(move |b| batch(rank, b * BATCH, ((b + 1) * BATCH).min(n))),
                );
                let mut acks = c.metrics.push(batches).await.map_err(status_error)?.into_inner();
                let mut stored = 0;
                while let Some(ack) = acks.message().await.map_err(status_error)? {
                    stored = ack.stored;
                }
                ensure!(stored == n as u64, "stream {rank}: {stored} of {n} points acknowledged");
                anyhow::Ok(())
            })
        })
        .collect();
    for r in futures::future::join_all(pushes).await {
        r.context("a push task panicked")??;
    }
    let seconds = start.elapsed().as_secs_f64();
    // Every acknowledged point is in the store.
    let mut c = control::connect(addr, None).await?;
    let runs = c.metrics.list_runs(ListRunsRequest {}).await.map_err(status_error)?.into_inner().runs;
    let stored = runs.iter().find(|r| r.run_id == METRICS_RUN).map_or(0, |r| r.points);
    ensure!(stored == points as u64, "the store holds {stored} of {points} points");
    Ok(IngestReport {
        streams,
        points,
        batch: BATCH,
        seconds,
        points_per_s: points as f64 / seconds.max(1e-12),
    })
}

async fn publish(addr: &str, blob: prost::bytes::Bytes, sha256: &str) -> anyhow::Result<f64> {
    let mut c = control::connect(addr, None).await?;
    let size = blob.len();
    let header = BlobHeader { name: BLOB.into(), size: size as u64, sha256: sha256.to_string() };
    let chunks = futures::stream::iter((0..size.div_ceil(CHUNK)).map(move |i| PublishChunk {
        header: (i == 0).then(|| header.clone()),
        data: blob.slice(i * CHUNK..((i + 1) * CHUNK).min(size)),
    }));
    let start = Instant::now();
    let info =
        c.weights.publish(chunks).await.map_err(status_error).context("publishing the blob")?.into_inner();
    let seconds = start.elapsed().as_secs_f64();
    ensure!(info.size == size as u64 && info.sha256 == sha256, "the coordinator stored {info:?}");
    Ok(seconds)
}

/// One fetcher: its own thread and connection; with `verify`, hashing as the
/// chunks arrive (sha256 runs at about 1 GB/s on one core here, so the transfer
/// itself is timed in a second round that only counts bytes).
/// Returns its seconds (from the common start to its last byte).
fn fetch(
    addr: String,
    size: usize,
    sha256: String,
    start: Arc<Barrier>,
    verify: bool,
) -> anyhow::Result<f64> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let connected = rt.block_on(control::connect(&addr, None));
    start.wait();
    let mut c = connected?;
    rt.block_on(async {
        let t = Instant::now();
        let mut stream = c
            .weights
            .fetch(FetchRequest { name: BLOB.into(), chunk_bytes: CHUNK as u32 })
            .await
            .map_err(status_error)?
            .into_inner();
        let mut hasher = Sha256::new();
        let mut received = 0usize;
        let mut declared = None;
        while let Some(chunk) = stream.message().await.map_err(status_error)? {
            if let Some(info) = chunk.info {
                declared = Some(info.sha256);
            }
            received += chunk.data.len();
            if verify {
                hasher.update(&chunk.data);
            }
        }
        let seconds = t.elapsed().as_secs_f64();
        ensure!(received == size, "fetched {received} of {size} bytes");
        ensure!(declared.as_deref() == Some(sha256.as_str()), "the first chunk declared sha256 {declared:?}");
        if verify {
            let got = hex(&hasher.finalize());
            ensure!(got == sha256, "the fetched bytes hash to {got}, expected {sha256}");
        }
        Ok(seconds)
    })
}

fn spinner(json: bool) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() && !json {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(None, target);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// `drove bench coordinator`.
pub fn run(args: &CoordinatorArgs) -> anyhow::Result<()> {
    raise_open_files(2 * (args.workers.max(args.streams).max(args.fetchers) as u64) + 256);
    let pb = spinner(args.json);
    let rt = control::runtime("drove-bench")?;
    let store =
        tempfile::Builder::new().prefix("drove-bench-store-").tempdir().context("creating the store")?;
    let config = drove_coordinator::Config {
        listen: ([127, 0, 0, 1], 0).into(),
        store: store.path().to_path_buf(),
        join_timeout_ms: 120_000,
        ..Default::default()
    };
    let server = rt
        .block_on(drove_coordinator::start(&config))
        .map_err(|e| anyhow!("starting the coordinator: {e}"))?;
    let addr = server.addr().to_string();

    pb.set_message(format!("rendezvous of {} workers", args.workers));
    let rendezvous = rt.block_on(bench_rendezvous(&addr, args.workers)).context("rendezvous")?;
    pb.set_message(format!("ingesting {} points over {} streams", args.points, args.streams));
    let metrics_ingest =
        rt.block_on(bench_ingest(&addr, args.streams, args.points)).context("metrics ingest")?;

    pb.set_message(format!("generating a {} MiB blob", args.blob_mib));
    let blob = prost::bytes::Bytes::from(pseudo_random(args.blob_mib << 20));
    let size = blob.len();
    let t = Instant::now();
    let sha256 = hex(&Sha256::digest(&blob[..]));
    let sha256_seconds = t.elapsed().as_secs_f64();
    let (memcpy_s, memcpy_buffer_bytes) = memcpy_seconds(&blob);

    pb.set_message(format!("publishing {} MiB", args.blob_mib));
    let publish_seconds = rt.block_on(publish(&addr, blob.clone(), &sha256)).context("publishing")?;
    drop(blob);

    let rounds = fetch_rounds(&pb, &addr, size, &sha256, args.fetchers)?;
    rt.block_on(server.shutdown());
    drop(store);
    pb.finish_and_clear();

    let blob = blob_report(size, sha256, publish_seconds, args.fetchers, &rounds);
    let sha256_gbps = gbps(size, sha256_seconds);
    let memcpy_gbps = gbps(size, memcpy_s);
    let report = Report {
        machine: Machine::detect(),
        rendezvous,
        metrics_ingest,
        baseline: Baseline { sha256_seconds, sha256_gbps, memcpy_gbps, memcpy_buffer_bytes },
        ratios: Ratios {
            publish_vs_sha256: blob.publish_gbps / sha256_gbps,
            fetch_mean_vs_sha256: blob.fetch_gbps_mean / sha256_gbps,
            fetch_mean_vs_memcpy: blob.fetch_gbps_mean / memcpy_gbps,
        },
        blob,
    };
    for (what, x) in [
        ("rendezvous seconds", report.rendezvous.seconds),
        ("points/s", report.metrics_ingest.points_per_s),
        ("publish GB/s", report.blob.publish_gbps),
        ("fetch GB/s", report.blob.fetch_gbps_min),
    ] {
        if !(x.is_finite() && x > 0.0) {
            bail!("the {what} figure came out as {x}");
        }
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, args.blob_mib);
    }
    Ok(())
}

/// Every fetcher's seconds in the verifying round and in the timed one, and
/// the timed round's wall-clock seconds.
struct FetchRounds {
    verified_seconds: Vec<f64>,
    seconds: Vec<f64>,
    wall_seconds: f64,
}

/// Round 1 verifies every byte (sha256 while receiving); round 2 times the
/// transfer. Each round starts its `fetchers` threads together.
fn fetch_rounds(
    pb: &ProgressBar,
    addr: &str,
    size: usize,
    sha256: &str,
    fetchers: usize,
) -> anyhow::Result<FetchRounds> {
    let mut rounds = FetchRounds { verified_seconds: Vec::new(), seconds: Vec::new(), wall_seconds: 0.0 };
    for verify in [true, false] {
        pb.set_message(format!("{fetchers} fetchers{}", if verify { ", verifying" } else { "" }));
        let start = Arc::new(Barrier::new(fetchers + 1));
        let threads = (0..fetchers)
            .map(|i| {
                let (addr, sha, start) = (addr.to_string(), sha256.to_string(), Arc::clone(&start));
                std::thread::Builder::new()
                    .name(format!("fetch-{i}"))
                    .spawn(move || fetch(addr, size, sha, start, verify))
                    .context("starting a fetcher thread")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        start.wait();
        let wall = Instant::now();
        let out = if verify { &mut rounds.verified_seconds } else { &mut rounds.seconds };
        for t in threads {
            out.push(t.join().map_err(|_| anyhow!("a fetcher panicked"))?.context("fetching")?);
        }
        if !verify {
            rounds.wall_seconds = wall.elapsed().as_secs_f64();
        }
    }
    Ok(rounds)
}

/// The blob's figures: the publish, and the fetch rounds' rates.
fn blob_report(
    size: usize,
    sha256: String,
    publish_seconds: f64,
    fetchers: usize,
    rounds: &FetchRounds,
) -> BlobReport {
    let verified_rates: Vec<f64> = rounds.verified_seconds.iter().map(|&s| gbps(size, s)).collect();
    let rates: Vec<f64> = rounds.seconds.iter().map(|&s| gbps(size, s)).collect();
    BlobReport {
        bytes: size,
        chunk_bytes: CHUNK,
        sha256,
        publish_seconds,
        publish_gbps: gbps(size, publish_seconds),
        fetchers,
        fetch_wall_seconds: rounds.wall_seconds,
        fetch_gbps_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
        fetch_gbps_mean: rates.iter().sum::<f64>() / rates.len() as f64,
        fetch_gbps_aggregate: gbps(size * fetchers, rounds.wall_seconds),
        fetch_verified_gbps_mean: verified_rates.iter().sum::<f64>() / verified_rates.len() as f64,
        verified: true,
    }
}

/// The report as text.
fn print_report(r: &Report, blob_mib: usize) {
    println!("coordinator in-process on loopback, temporary store");
    println!(
        "rendezvous      {} workers joined in {:.3} s ({:.0} joins/s; connecting took {:.3} s)",
        r.rendezvous.workers, r.rendezvous.seconds, r.rendezvous.joins_per_s, r.rendezvous.connect_seconds
    );
    println!(
        "metrics ingest  {} points over {} streams in {:.2} s: {:.0} points/s (acknowledged = stored)",
        r.metrics_ingest.points,
        r.metrics_ingest.streams,
        r.metrics_ingest.seconds,
        r.metrics_ingest.points_per_s
    );
    println!(
        "blob publish    {} MiB in {:.2} s: {:.3} GB/s ({:.2}x sha256)",
        blob_mib, r.blob.publish_seconds, r.blob.publish_gbps, r.ratios.publish_vs_sha256
    );
    println!(
        "blob fetch      {} fetchers in {:.2} s: min {:.3}, mean {:.3} GB/s each, {:.3} GB/s together (sha256 verified)",
        r.blob.fetchers,
        r.blob.fetch_wall_seconds,
        r.blob.fetch_gbps_min,
        r.blob.fetch_gbps_mean,
        r.blob.fetch_gbps_aggregate
    );
    println!(
        "baseline        sha256 {:.3} GB/s, memcpy {:.3} GB/s (same run)",
        r.baseline.sha256_gbps, r.baseline.memcpy_gbps
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_random_bytes_are_deterministic_and_varied() {
        let a = pseudo_random(1 << 12);
        assert_eq!(a, pseudo_random(1 << 12));
        let zeros = a.iter().filter(|&&b| b == 0).count();
        assert!(zeros < 64, "{zeros} zero bytes of 4096");
        assert_eq!(pseudo_random(13).len(), 13);
    }
}

//! The coordinator suite: starts a coordinator in-process (loopback,
//! temporary store) and measures its three services the way a job uses them:
//!
//! - rendezvous: `workers` concurrent Join calls into one run, each on its own
//!   connection, from the first call to the last response;
//! - metrics ingest: `streams` concurrent Push streams (one rank each) of
//!   1000-point batches, until every point is acknowledged (= persisted);
//! - blob: publishing a `blob_mib` MiB blob of pseudo-random bytes in 1 MiB
//!   chunks with its sha256, then `fetchers` concurrent Fetch streams, each
//!   hashing what it receives and checking it against the published sha256.
//!
//! Baselines from the same run (sha256 of the blob in memory, a memory copy) let
//! the figures be quoted as ratios. The blob is generated once and streamed from;
//! fetchers hash incrementally and keep nothing. The gRPC calls are in `grpc.rs`.

mod grpc;
mod report;
mod shared;

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

use crate::error::Doing as _;
use crate::measure::{median, spinner};
use crate::{BenchError, Machine};

pub use report::{BlobReport, CoordinatorReport, IngestReport, Ratios, RendezvousReport};
pub use shared::Baseline;
use shared::{Blob, FetchRounds, gbps, hex};

/// Settings of the coordinator suite (`drove bench coordinator`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct CoordinatorOptions {
    /// Workers joining one run concurrently.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 256, value_name = "N", value_parser = parse::workers))]
    pub workers: usize,
    /// Concurrent metric Push streams (one rank each).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 8, value_name = "N", value_parser = parse::streams))]
    pub streams: usize,
    /// Metric points pushed in all, in batches of 1000.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2_000_000, value_name = "N",
        value_parser = parse::points))]
    pub points: usize,
    /// Size of the blob published and fetched, in MiB.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1024, value_name = "MIB",
        value_parser = parse::blob_mib))]
    pub blob_mib: usize,
    /// Concurrent Fetch streams of the blob.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3, value_name = "N", value_parser = parse::fetchers))]
    pub fetchers: usize,
    /// A spinner on stderr while measuring, when stderr is a terminal (no
    /// flag; on by default, off with `drove bench coordinator --json`).
    #[cfg_attr(feature = "clap", arg(skip = true))]
    pub progress: bool,
}

impl Default for CoordinatorOptions {
    fn default() -> Self {
        CoordinatorOptions {
            workers: 256,
            streams: 8,
            points: 2_000_000,
            blob_mib: 1024,
            fetchers: 3,
            progress: true,
        }
    }
}

#[cfg(feature = "clap")]
mod parse {
    use crate::flags::at_least;

    pub fn workers(s: &str) -> Result<usize, String> {
        let n = at_least(s, 1, "workers", " worker")?;
        if n > 4096 {
            Err(format!("workers must be at most 4096 (one connection each), found {n}"))
        } else {
            Ok(n)
        }
    }

    pub fn streams(s: &str) -> Result<usize, String> {
        at_least(s, 1, "streams", " stream")
    }

    pub fn points(s: &str) -> Result<usize, String> {
        at_least(s, 1, "points", " point")
    }

    pub fn blob_mib(s: &str) -> Result<usize, String> {
        let n = at_least(s, 1, "blob-mib", " MiB")?;
        if n > 64 << 10 { Err(format!("blob-mib must be at most 65536 (64 GiB), found {n}")) } else { Ok(n) }
    }

    pub fn fetchers(s: &str) -> Result<usize, String> {
        at_least(s, 1, "fetchers", " fetcher")
    }
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
    let times: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            for piece in blob.chunks(buffer) {
                dst[..piece.len()].copy_from_slice(black_box(piece));
                black_box(&mut dst);
            }
            t.elapsed().as_secs_f64()
        })
        .collect();
    (median(times).unwrap_or(f64::NAN), buffer)
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

/// Generates the blob, measures the baselines on it, and publishes it.
fn publish_blob(
    rt: &tokio::runtime::Runtime,
    pb: &ProgressBar,
    addr: &str,
    blob_mib: usize,
) -> Result<Blob, BenchError> {
    pb.set_message(format!("generating a {blob_mib} MiB blob"));
    let blob = prost::bytes::Bytes::from(pseudo_random(blob_mib << 20));
    let size = blob.len();
    let t = Instant::now();
    let sha256 = hex(&Sha256::digest(&blob[..]));
    let sha256_seconds = t.elapsed().as_secs_f64();
    let (memcpy_s, memcpy_buffer_bytes) = memcpy_seconds(&blob);
    pb.set_message(format!("publishing {blob_mib} MiB"));
    let publish_seconds = rt.block_on(grpc::publish(addr, blob, &sha256)).doing("publishing")?;
    let baseline = Baseline {
        sha256_seconds,
        sha256_gbps: gbps(size, sha256_seconds),
        memcpy_gbps: gbps(size, memcpy_s),
        memcpy_buffer_bytes,
    };
    Ok(Blob { size, sha256, publish_seconds, baseline })
}

/// Runs the suite on a coordinator of its own (loopback, a temporary store
/// removed at the end).
pub fn run(o: &CoordinatorOptions) -> Result<CoordinatorReport, BenchError> {
    raise_open_files(2 * (o.workers.max(o.streams).max(o.fetchers) as u64) + 256);
    let pb = spinner(o.progress);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("drove-bench")
        .build()
        .doing("starting the async runtime")?;
    let store =
        tempfile::Builder::new().prefix("drove-bench-store-").tempdir().doing("creating the store")?;
    let config = drove_coordinator::Config {
        listen: ([127, 0, 0, 1], 0).into(),
        store: store.path().to_path_buf(),
        join_timeout_ms: 120_000,
        ..Default::default()
    };
    let server = rt.block_on(drove_coordinator::start(&config)).doing("starting the coordinator")?;
    let addr = server.addr().to_string();

    pb.set_message(format!("rendezvous of {} workers", o.workers));
    let rendezvous = rt.block_on(grpc::rendezvous(&addr, o.workers)).doing("rendezvous")?;
    pb.set_message(format!("ingesting {} points over {} streams", o.points, o.streams));
    let metrics_ingest = rt.block_on(grpc::ingest(&addr, o.streams, o.points)).doing("metrics ingest")?;
    let blob = publish_blob(&rt, &pb, &addr, o.blob_mib)?;
    let rounds = fetch_rounds(&pb, &addr, blob.size, &blob.sha256, o.fetchers)?;
    rt.block_on(server.shutdown());
    drop(store);
    pb.finish_and_clear();

    let report =
        CoordinatorReport::new(Machine::detect(), rendezvous, metrics_ingest, blob, o.fetchers, &rounds);
    report.check()?;
    Ok(report)
}

/// Round 1 verifies every byte (sha256 while receiving); round 2 times the
/// transfer. Each round starts its `fetchers` threads together.
fn fetch_rounds(
    pb: &ProgressBar,
    addr: &str,
    size: usize,
    sha256: &str,
    fetchers: usize,
) -> Result<FetchRounds, BenchError> {
    let mut rounds = FetchRounds { verified_seconds: Vec::new(), seconds: Vec::new(), wall_seconds: 0.0 };
    for verify in [true, false] {
        pb.set_message(format!("{fetchers} fetchers{}", if verify { ", verifying" } else { "" }));
        let start = Arc::new(Barrier::new(fetchers + 1));
        let threads = (0..fetchers)
            .map(|i| {
                let (addr, sha, start) = (addr.to_string(), sha256.to_string(), Arc::clone(&start));
                std::thread::Builder::new()
                    .name(format!("fetch-{i}"))
                    .spawn(move || grpc::fetch(&addr, size, &sha, &start, verify))
                    .doing("starting a fetcher thread")
            })
            .collect::<Result<Vec<_>, _>>()?;
        start.wait();
        let wall = Instant::now();
        let out = if verify { &mut rounds.verified_seconds } else { &mut rounds.seconds };
        for t in threads {
            let seconds = t.join().map_err(|_| BenchError::Check("a fetcher panicked".into()))?;
            out.push(seconds.doing("fetching")?);
        }
        if !verify {
            rounds.wall_seconds = wall.elapsed().as_secs_f64();
        }
    }
    Ok(rounds)
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

    #[cfg(feature = "clap")]
    #[test]
    fn no_flags_are_the_default_options() {
        assert_eq!(crate::flags::parsed_from_no_flags::<CoordinatorOptions>(), CoordinatorOptions::default());
    }
}

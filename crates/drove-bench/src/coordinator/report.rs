//! What the coordinator suite reports (the JSON of `drove bench coordinator
//! --json`), and its text.

use std::fmt;

use serde::Serialize;

use super::shared::{Baseline, Blob, CHUNK, FetchRounds, gbps};
use crate::{BenchError, Machine};

/// The coordinator suite's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CoordinatorReport {
    /// Where it ran.
    pub machine: Machine,
    /// Concurrent joins into one run.
    pub rendezvous: RendezvousReport,
    /// Metric points pushed until acknowledged.
    pub metrics_ingest: IngestReport,
    /// A blob published and fetched.
    pub blob: BlobReport,
    /// sha256 and a memory copy of the blob, in the same run.
    pub baseline: Baseline,
    /// The blob's rates over the baselines.
    pub ratios: Ratios,
}

/// Concurrent Join calls into one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RendezvousReport {
    /// Workers joining, each on its own connection.
    pub workers: usize,
    /// Seconds to open every connection.
    pub connect_seconds: f64,
    /// Seconds from the first call to the last response.
    pub seconds: f64,
    /// Workers over `seconds`.
    pub joins_per_s: f64,
}

/// Concurrent metric Push streams.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IngestReport {
    /// Streams, one rank each.
    pub streams: usize,
    /// Points pushed in all.
    pub points: usize,
    /// Points a batch.
    pub batch: usize,
    /// Seconds until every point was acknowledged (= stored).
    pub seconds: f64,
    /// Points over `seconds`.
    pub points_per_s: f64,
}

/// A blob published in chunks, then fetched by concurrent streams.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BlobReport {
    /// Its bytes.
    pub bytes: usize,
    /// Bytes a chunk.
    pub chunk_bytes: usize,
    /// Its sha256, hex.
    pub sha256: String,
    /// Seconds to publish it.
    pub publish_seconds: f64,
    /// Its bytes over `publish_seconds`, GB/s.
    pub publish_gbps: f64,
    /// Concurrent fetchers.
    pub fetchers: usize,
    /// Seconds from the timed round's start to its last fetcher's last byte.
    pub fetch_wall_seconds: f64,
    /// The slowest fetcher's rate, GB/s.
    pub fetch_gbps_min: f64,
    /// The fetchers' mean rate, GB/s.
    pub fetch_gbps_mean: f64,
    /// Every fetcher's bytes over `fetch_wall_seconds`, GB/s.
    pub fetch_gbps_aggregate: f64,
    /// Mean per-fetcher rate of the first round, which hashed every byte.
    pub fetch_verified_gbps_mean: f64,
    /// Every fetcher's bytes hashed to the published sha256.
    pub verified: bool,
}

/// The blob's rates over the baselines.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ratios {
    /// Publish over sha256.
    pub publish_vs_sha256: f64,
    /// The mean fetch over sha256.
    pub fetch_mean_vs_sha256: f64,
    /// The mean fetch over the memory copy.
    pub fetch_mean_vs_memcpy: f64,
}

impl CoordinatorReport {
    pub(super) fn new(
        machine: Machine,
        rendezvous: RendezvousReport,
        metrics_ingest: IngestReport,
        blob: Blob,
        fetchers: usize,
        rounds: &FetchRounds,
    ) -> CoordinatorReport {
        let Blob { size, sha256, publish_seconds, baseline } = blob;
        let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
        let verified_rates: Vec<f64> = rounds.verified_seconds.iter().map(|&s| gbps(size, s)).collect();
        let rates: Vec<f64> = rounds.seconds.iter().map(|&s| gbps(size, s)).collect();
        let blob = BlobReport {
            bytes: size,
            chunk_bytes: CHUNK,
            sha256,
            publish_seconds,
            publish_gbps: gbps(size, publish_seconds),
            fetchers,
            fetch_wall_seconds: rounds.wall_seconds,
            fetch_gbps_min: rates.iter().copied().fold(f64::INFINITY, f64::min),
            fetch_gbps_mean: mean(&rates),
            fetch_gbps_aggregate: gbps(size * fetchers, rounds.wall_seconds),
            fetch_verified_gbps_mean: mean(&verified_rates),
            verified: true,
        };
        let ratios = Ratios {
            publish_vs_sha256: blob.publish_gbps / baseline.sha256_gbps,
            fetch_mean_vs_sha256: blob.fetch_gbps_mean / baseline.sha256_gbps,
            fetch_mean_vs_memcpy: blob.fetch_gbps_mean / baseline.memcpy_gbps,
        };
        CoordinatorReport { machine, rendezvous, metrics_ingest, blob, baseline, ratios }
    }

    /// Every headline figure is a positive number.
    pub(super) fn check(&self) -> Result<(), BenchError> {
        for (what, x) in [
            ("rendezvous seconds", self.rendezvous.seconds),
            ("points/s", self.metrics_ingest.points_per_s),
            ("publish GB/s", self.blob.publish_gbps),
            ("fetch GB/s", self.blob.fetch_gbps_min),
        ] {
            if !(x.is_finite() && x > 0.0) {
                return Err(BenchError::Check(format!("the {what} figure came out as {x}")));
            }
        }
        Ok(())
    }
}

/// The report as text, a line per service and one for the baselines.
impl fmt::Display for CoordinatorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self;
        writeln!(f, "coordinator in-process on loopback, temporary store")?;
        writeln!(
            f,
            "rendezvous      {} workers joined in {:.3} s ({:.0} joins/s; connecting took {:.3} s)",
            r.rendezvous.workers,
            r.rendezvous.seconds,
            r.rendezvous.joins_per_s,
            r.rendezvous.connect_seconds
        )?;
        writeln!(
            f,
            "metrics ingest  {} points over {} streams in {:.2} s: {:.0} points/s (acknowledged = stored)",
            r.metrics_ingest.points,
            r.metrics_ingest.streams,
            r.metrics_ingest.seconds,
            r.metrics_ingest.points_per_s
        )?;
        writeln!(
            f,
            "blob publish    {} MiB in {:.2} s: {:.3} GB/s ({:.2}x sha256)",
            r.blob.bytes >> 20,
            r.blob.publish_seconds,
            r.blob.publish_gbps,
            r.ratios.publish_vs_sha256
        )?;
        writeln!(
            f,
            "blob fetch      {} fetchers in {:.2} s: min {:.3}, mean {:.3} GB/s each, {:.3} GB/s together (sha256 verified)",
            r.blob.fetchers,
            r.blob.fetch_wall_seconds,
            r.blob.fetch_gbps_min,
            r.blob.fetch_gbps_mean,
            r.blob.fetch_gbps_aggregate
        )?;
        writeln!(
            f,
            "baseline        sha256 {:.3} GB/s, memcpy {:.3} GB/s (same run)",
            r.baseline.sha256_gbps, r.baseline.memcpy_gbps
        )
    }
}

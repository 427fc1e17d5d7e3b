//! What the coordinator suite's parts share: its sizes and names, the blob's
//! figures, a round of fetches, and the units they are reported in.

use serde::Serialize;

pub(super) const BATCH: usize = 1000;
pub(super) const CHUNK: usize = 1 << 20;
pub(super) const RENDEZVOUS_RUN: &str = "bench-rendezvous";
pub(super) const METRICS_RUN: &str = "bench-metrics";
pub(super) const BLOB: &str = "bench/blob";

/// Lower-case hex of `bytes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn gbps(bytes: usize, seconds: f64) -> f64 {
    bytes as f64 / seconds.max(1e-12) / 1e9
}

/// The blob's figures before the fetches: its bytes, sha256 and the baselines.
pub(super) struct Blob {
    pub(super) size: usize,
    pub(super) sha256: String,
    pub(super) publish_seconds: f64,
    pub(super) baseline: Baseline,
}

/// Every fetcher's seconds in the verifying round and in the timed one, and
/// the timed round's wall-clock seconds.
pub(super) struct FetchRounds {
    pub(super) verified_seconds: Vec<f64>,
    pub(super) seconds: Vec<f64>,
    pub(super) wall_seconds: f64,
}

/// The blob's baselines, in the same run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Baseline {
    /// Seconds to hash the blob in memory.
    pub sha256_seconds: f64,
    /// Its bytes over `sha256_seconds`, GB/s.
    pub sha256_gbps: f64,
    /// Copying it through a buffer, GB/s.
    pub memcpy_gbps: f64,
    /// That buffer's bytes (at most 64 MiB).
    pub memcpy_buffer_bytes: usize,
}

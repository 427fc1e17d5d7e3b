//! The waits between retries of a failed push: from a minimum, doubling up to
//! a maximum ([`Backoff`]), each shortened at random ([`Jitter`]) so ranks do
//! not retry in step.

use std::time::Duration;

/// Capped exponential backoff with jitter.
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    jitter: Jitter,
}

impl Backoff {
    /// Waits from `min`, doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max, next: min, jitter: Jitter::new() }
    }

    /// Starts again from the first wait (for a new batch).
    pub fn reset(&mut self) {
        self.next = self.min;
    }

    /// The wait before the next retry (shortened by the jitter); the one after
    /// it doubles, up to the maximum.
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.jitter.shorten(self.next);
        self.next = (self.next * 2).min(self.max);
        wait
    }
}

/// Random shortening of backoff waits (xorshift, seeded by time and process).
struct Jitter(u64);

impl Jitter {
    /// A generator seeded by the clock and the process id.
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
    fn jitter_stays_within_half_and_whole() {
        let mut j = Jitter::new();
        let d = Duration::from_secs(4);
        let waits: Vec<Duration> = (0..1000).map(|_| j.shorten(d)).collect();
        assert!(waits.iter().all(|w| *w >= d / 2 && *w < d), "{waits:?}");
        assert!(waits.iter().any(|w| *w != waits[0]), "jitter varies");
    }
}

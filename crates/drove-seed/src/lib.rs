//! # drove-seed: independent random streams, derived from a whole key
//!
//! Data-parallel training goes wrong quietly when two ranks or two loader workers
//! draw from the same random stream: they apply the same augmentation to their
//! shards and the extra ranks add little. The usual causes are one seed copied into
//! every process, and seeds formed by *adding* ids (`seed + rank`), which collide
//! across neighbouring seeds (`seed 42, rank 1` is `seed 43, rank 0`).
//!
//! This crate names every stream by a [`StreamKey`]: base seed, [`Purpose`], rank,
//! loader worker, epoch and a lane for sub-streams. The whole key is hashed into the
//! generator state with NumPy's SeedSequence algorithm (bit for bit, so a state can
//! be reproduced from Python), never by arithmetic on the ids. The purposes are
//! separate families with fixed semantics, enforced by the constructors:
//!
//! | purpose | same on every rank? | constructor |
//! |---|---|---|
//! | [`Purpose::Shuffle`] | yes: the sampler order must agree | [`StreamKey::shuffle`] |
//! | [`Purpose::Augment`] | no: distinct per rank x worker x epoch | [`StreamKey::augment`] |
//! | [`Purpose::Init`] | yes (or broadcast from rank 0) | [`StreamKey::init`] |
//! | [`Purpose::Dropout`] | no: distinct per rank | [`StreamKey::dropout`] |
//!
//! Two kinds of stream are offered. A [`StreamKey`] gives a sequential
//! [`Pcg64`] stream, for arbitrary user code running in one rank's loader worker.
//! [`SampleStreams`] gives a counter-based ChaCha8 stream per global sample index,
//! so that the augmentation of a sample does not depend on which rank or worker
//! happens to process it: a run stays reproducible when it is re-sharded.
//!
//! Every derived seed prints as 64 hex digits ([`DerivedSeed`]) and parses back, so a
//! stream seen in a log can be replayed.
//!
//! A constructor with more than one field takes them by name, in a small
//! struct ([`ShuffleKey`], [`AugmentKey`], [`DropoutKey`]), as the Python
//! package takes them as keywords: a rank and a worker, or a seed and an
//! epoch, have the same type and would swap silently by position.
//!
//! The bug itself stays available, explicitly, as [`StreamKey::naive`]: one key
//! for every rank, worker and epoch. It exists for the diagnostic and tests.
//!
//! ```
//! use drove_seed::{AugmentKey, StreamKey};
//! use rand_core::Rng;
//!
//! let rank0 = AugmentKey { seed: 42, rank: 0, worker: 0, epoch: 0 };
//! let mut a = StreamKey::augment(rank0).pcg64();
//! let mut b = StreamKey::augment(AugmentKey { rank: 1, ..rank0 }).pcg64();
//! assert_ne!(a.next_u64(), b.next_u64());
//! // The same key is the same stream, in any process.
//! let mut again = StreamKey::augment(rank0).pcg64();
//! let mut a2 = StreamKey::augment(rank0).pcg64();
//! assert_eq!(again.next_u64(), a2.next_u64());
//! ```
#![deny(missing_docs)]

pub mod seedseq;

use std::fmt;
use std::str::FromStr;

pub use rand_chacha::ChaCha8Rng;
/// The RNG traits the streams implement (`Rng::next_u64`, ...), so a caller
/// draws from them without a dependency of its own.
pub use rand_core;
pub use rand_pcg::Pcg64;

/// Magic word that opens every key ("drov"), so drove's states never coincide with
/// a SeedSequence built from the same integers by other code.
const MAGIC: u32 = 0x6472_6f76;
/// Version of the key layout. Changing the layout changes every stream: bump it.
const LAYOUT_VERSION: u32 = 1;

/// What a stream is used for. Streams of different purposes never coincide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// Sampler order: identical on every rank.
    Shuffle,
    /// Data augmentation (masking): distinct per rank, worker and epoch.
    Augment,
    /// Parameter initialisation: identical on every rank.
    Init,
    /// Dropout: distinct per rank.
    Dropout,
}

impl Purpose {
    fn tag(self) -> u32 {
        match self {
            Purpose::Shuffle => 1,
            Purpose::Augment => 2,
            Purpose::Init => 3,
            Purpose::Dropout => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Purpose::Shuffle => "shuffle",
            Purpose::Augment => "augment",
            Purpose::Init => "init",
            Purpose::Dropout => "dropout",
        }
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which kind of stream a key names; part of the hashed key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Family {
    /// A sequential stream for one (rank, worker, epoch).
    Sequential,
    /// The key of a family of per-sample counter-based streams.
    PerSample,
    /// The deliberately broken key of the story: one stream for everyone.
    Naive,
}

impl Family {
    fn tag(self) -> u32 {
        match self {
            Family::Sequential => 0,
            Family::PerSample => 1,
            Family::Naive => 2,
        }
    }
}

/// The fields of a shuffle key, by name (see [`StreamKey::shuffle`]): the
/// base seed and the epoch, two `u64`s that a positional call could swap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShuffleKey {
    /// Base seed.
    pub seed: u64,
    /// Epoch.
    pub epoch: u64,
}

/// The fields of an augmentation key, by name (see [`StreamKey::augment`]),
/// as the Python package takes them as keywords
/// (`StreamKey.augment(seed=42, rank=1, worker=2, epoch=3)`). Every field
/// is named and none has a default: a rank or worker left out would give
/// two processes the same stream, the bug this crate exists to prevent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AugmentKey {
    /// Base seed.
    pub seed: u64,
    /// This process's rank.
    pub rank: u32,
    /// The loader worker within the rank.
    pub worker: u32,
    /// Epoch.
    pub epoch: u64,
}

/// The fields of a dropout key, by name (see [`StreamKey::dropout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DropoutKey {
    /// Base seed.
    pub seed: u64,
    /// This process's rank.
    pub rank: u32,
    /// The training step (the key's epoch field).
    pub step: u64,
}

/// The full name of a random stream. Two different keys give independent streams;
/// the same key gives the same stream in every process, on every platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey {
    seed: u64,
    purpose: Purpose,
    family: Family,
    rank: u32,
    worker: u32,
    epoch: u64,
    lane: u32,
}

/// Number of 32-bit words a key hashes.
pub const KEY_WORDS: usize = 12;

impl StreamKey {
    fn new(seed: u64, purpose: Purpose, family: Family, rank: u32, worker: u32, epoch: u64) -> Self {
        StreamKey { seed, purpose, family, rank, worker, epoch, lane: 0 }
    }

    /// The sampler's order for an epoch: the same on every rank, by construction
    /// (the key has no rank).
    pub fn shuffle(key: ShuffleKey) -> Self {
        let ShuffleKey { seed, epoch } = key;
        Self::new(seed, Purpose::Shuffle, Family::Sequential, 0, 0, epoch)
    }

    /// Augmentation stream of loader `worker` on `rank` in `epoch`: distinct for
    /// every (rank, worker, epoch).
    pub fn augment(key: AugmentKey) -> Self {
        let AugmentKey { seed, rank, worker, epoch } = key;
        Self::new(seed, Purpose::Augment, Family::Sequential, rank, worker, epoch)
    }

    /// Initialisation stream: the same on every rank.
    pub fn init(seed: u64) -> Self {
        Self::new(seed, Purpose::Init, Family::Sequential, 0, 0, 0)
    }

    /// Dropout stream of `rank` at `step`: distinct per rank and per step
    /// (drove-ner keys each training step's dropout by its global step). The
    /// step is hashed where other keys hash their epoch; `drove seed --purpose
    /// dropout` names it `--step`, Python's `StreamKey.dropout` `step=`.
    pub fn dropout(key: DropoutKey) -> Self {
        let DropoutKey { seed, rank, step } = key;
        Self::new(seed, Purpose::Dropout, Family::Sequential, rank, 0, step)
    }

    /// **The bug, on purpose.** One augmentation stream for every rank, worker and
    /// epoch, as when `random.seed(42)` runs in every process before the loader
    /// forks its workers. For the diagnostic and tests only.
    pub fn naive(seed: u64) -> Self {
        Self::new(seed, Purpose::Augment, Family::Naive, 0, 0, 0)
    }

    /// The key of a family of per-sample streams (see [`SampleStreams`]).
    fn per_sample(seed: u64, purpose: Purpose, epoch: u64) -> Self {
        Self::new(seed, purpose, Family::PerSample, 0, 0, epoch)
    }

    /// The same key on another lane: for independent sub-streams of one purpose
    /// (lane 0 is the default; the sampler uses lane 0, batch order lane 1).
    pub fn with_lane(mut self, lane: u32) -> Self {
        self.lane = lane;
        self
    }

    /// Base seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
    /// Purpose.
    pub fn purpose(&self) -> Purpose {
        self.purpose
    }
    /// Rank (0 for purposes that are the same on every rank).
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// Loader worker.
    pub fn worker(&self) -> u32 {
        self.worker
    }
    /// Epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// Lane.
    pub fn lane(&self) -> u32 {
        self.lane
    }
    /// Whether this is the deliberately shared key of [`StreamKey::naive`].
    pub fn is_naive(&self) -> bool {
        self.family == Family::Naive
    }

    /// The words that are hashed: every field, at a fixed position, with a magic
    /// word and a layout version. Equivalent in Python:
    /// `SeedSequence(np.array(key.words(), dtype=np.uint32)).generate_state(8)`.
    pub fn words(&self) -> [u32; KEY_WORDS] {
        [
            MAGIC,
            LAYOUT_VERSION,
            self.purpose.tag(),
            self.family.tag(),
            self.seed as u32,
            (self.seed >> 32) as u32,
            self.rank,
            self.worker,
            self.epoch as u32,
            (self.epoch >> 32) as u32,
            self.lane,
            0,
        ]
    }

    /// Hashes the whole key into 256 bits of generator state.
    pub fn derive(&self) -> DerivedSeed {
        let pool = seedseq::pool(&self.words());
        let w: [u32; 8] = seedseq::generate_state(&pool);
        let mut s = [0u64; 4];
        for (i, slot) in s.iter_mut().enumerate() {
            *slot = u64::from(w[2 * i]) | (u64::from(w[2 * i + 1]) << 32);
        }
        DerivedSeed(s)
    }

    /// The sequential PCG-64 stream this key names.
    pub fn pcg64(&self) -> Pcg64 {
        self.derive().pcg64()
    }
}

impl fmt::Display for StreamKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = match self.family {
            Family::Sequential => "",
            Family::PerSample => " per-sample",
            Family::Naive => " NAIVE",
        };
        write!(
            f,
            "{}{} seed={} rank={} worker={} epoch={} lane={}",
            self.purpose, family, self.seed, self.rank, self.worker, self.epoch, self.lane
        )
    }
}

/// 256 bits of generator state derived from a [`StreamKey`]. Prints as 64 hex
/// digits and parses back, so a stream seen in a log can be replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DerivedSeed([u64; 4]);

impl DerivedSeed {
    /// The four 64-bit words (NumPy's `generate_state(4, np.uint64)`).
    pub fn words(&self) -> [u64; 4] {
        self.0
    }

    /// A PCG-64 (XSL-RR 128/64) generator seeded the way NumPy's `PCG64` seeds
    /// itself from a SeedSequence: state from words 0-1, stream from words 2-3.
    pub fn pcg64(&self) -> Pcg64 {
        let [a, b, c, d] = self.0;
        let state = (u128::from(a) << 64) | u128::from(b);
        let stream = (u128::from(c) << 64) | u128::from(d);
        Pcg64::new(state, stream)
    }

    /// A ChaCha8 generator keyed by all 256 bits (little-endian words).
    pub fn chacha8(&self) -> ChaCha8Rng {
        use rand_core::SeedableRng;
        let mut key = [0u8; 32];
        for (i, w) in self.0.iter().enumerate() {
            key[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        ChaCha8Rng::from_seed(key)
    }
}

impl fmt::Display for DerivedSeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for w in self.0 {
            write!(f, "{w:016x}")?;
        }
        Ok(())
    }
}

/// A string that is not a [`DerivedSeed`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid derived seed {input:?}: expected 64 hex digits, {problem}")]
pub struct ParseSeedError {
    input: String,
    problem: String,
}

impl FromStr for DerivedSeed {
    type Err = ParseSeedError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |problem: String| ParseSeedError { input: s.to_string(), problem };
        if s.len() != 64 {
            return Err(err(format!("found {} characters", s.len())));
        }
        let mut words = [0u64; 4];
        for (i, w) in words.iter_mut().enumerate() {
            let chunk = &s[16 * i..16 * i + 16];
            *w = u64::from_str_radix(chunk, 16)
                .map_err(|_| err(format!("found a non-hex digit in {chunk:?}")))?;
        }
        Ok(DerivedSeed(words))
    }
}

/// Counter-based per-sample streams: one ChaCha8 stream per global sample index,
/// addressed directly (no sequential state), for a given seed, purpose and epoch.
///
/// The augmentation of sample `i` in epoch `e` is the same whatever the number of
/// ranks and workers, and whichever of them processes it.
///
/// ```
/// use drove_seed::{Purpose, SampleStreams};
/// use rand_core::Rng;
///
/// let epoch0 = SampleStreams::new(42, Purpose::Augment, 0);
/// let first = epoch0.stream(7).next_u64();
/// assert_eq!(first, SampleStreams::new(42, Purpose::Augment, 0).stream(7).next_u64());
/// assert_ne!(first, epoch0.stream(8).next_u64());
/// assert_ne!(first, SampleStreams::new(42, Purpose::Augment, 1).stream(7).next_u64());
/// ```
#[derive(Clone, Debug)]
pub struct SampleStreams {
    key: StreamKey,
    seed: DerivedSeed,
    base: ChaCha8Rng,
}

impl SampleStreams {
    /// The family of per-sample streams for `(seed, purpose, epoch)`.
    pub fn new(seed: u64, purpose: Purpose, epoch: u64) -> Self {
        let key = StreamKey::per_sample(seed, purpose, epoch);
        let derived = key.derive();
        SampleStreams { key, seed: derived, base: derived.chacha8() }
    }

    /// Rebuilds a family from its logged [`SampleStreams::derived`] seed alone, to
    /// replay any sample's stream. The key is not recoverable from the seed, so
    /// the result has no key.
    pub fn from_derived(seed: DerivedSeed) -> ReplayedSampleStreams {
        ReplayedSampleStreams { base: seed.chacha8() }
    }

    /// The key of the family.
    pub fn key(&self) -> StreamKey {
        self.key
    }

    /// The derived ChaCha8 key of the family; with the sample index it replays
    /// any sample's stream (`seed.chacha8()` then `set_stream(sample)`).
    pub fn derived(&self) -> DerivedSeed {
        self.seed
    }

    /// The stream of global sample `sample`, from its start.
    pub fn stream(&self, sample: u64) -> ChaCha8Rng {
        let mut rng = self.base.clone();
        rng.set_stream(sample);
        rng.set_word_pos(0);
        rng
    }
}

/// Per-sample streams rebuilt from a logged [`DerivedSeed`]
/// (see [`SampleStreams::from_derived`]).
#[derive(Clone, Debug)]
pub struct ReplayedSampleStreams {
    base: ChaCha8Rng,
}

impl ReplayedSampleStreams {
    /// The stream of global sample `sample`, from its start.
    pub fn stream(&self, sample: u64) -> ChaCha8Rng {
        let mut rng = self.base.clone();
        rng.set_stream(sample);
        rng.set_word_pos(0);
        rng
    }
}

#[cfg(test)]
mod tests;

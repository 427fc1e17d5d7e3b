//! A distributed sampler with PyTorch's `DistributedSampler` semantics: every rank
//! shuffles the whole dataset with the same (seed, epoch) stream, the order is
//! padded (by repeating its start) or truncated to a multiple of the world size,
//! and rank `r` takes positions `r, r + W, r + 2W, ...`.
//!
//! An elastic run re-shards what is left of an epoch when its world changes:
//! [`DistributedSampler::starting_at`] takes the epoch's unpadded order from a
//! global position on, padded or truncated for the new world. Batch `k` of
//! every rank covers the positions `k*W*B .. (k+1)*W*B` of that rest, so the
//! positions applied after `k` steps are always a prefix of the order: the
//! epoch's progress is one number, whatever the world sizes were.

use drove_seed::{ShuffleKey, StreamKey};
use rand_core::Rng;

/// A rank that does not fit the world, or an empty world.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SamplerError {
    /// The world has no rank.
    #[error("world size must be at least 1, found 0")]
    EmptyWorld,
    /// The rank is not below the world size.
    #[error("rank {rank} is out of range for world size {world_size} (ranks are 0..{world_size})")]
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
}

/// What to do with the tail when the dataset does not divide by the world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Remainder {
    /// Repeat samples from the start of the order so every rank gets as many.
    Pad,
    /// Drop the tail so every rank gets as many.
    Drop,
}

/// A [`DistributedSampler`]'s place in its world and how it orders, by
/// name: the Python `Sampler`'s keywords (`world_size=`, `rank=`, `seed=`,
/// `shuffle=`, `drop_last=`) and PyTorch's `DistributedSampler`'s
/// arguments. Named fields, so that a dataset length, a world size and a
/// rank (three `usize`s) cannot swap by position.
///
/// The default is PyTorch's: seed 0, shuffled, padded; in a world of one
/// (rank 0 of 1). A distributed run names its `world_size` and `rank`:
///
/// ```
/// use drove_collate::{DistributedSampler, SamplerOptions};
///
/// let options = SamplerOptions { world_size: 4, rank: 1, seed: 42, ..SamplerOptions::default() };
/// let sampler = DistributedSampler::new(1000, options)?;
/// assert_eq!(sampler.indices().len(), 250);
/// # Ok::<(), drove_collate::SamplerError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SamplerOptions {
    /// How many ranks share the dataset (at least 1).
    pub world_size: usize,
    /// This rank (below `world_size`).
    pub rank: usize,
    /// The base seed of the shuffle stream (the same on every rank).
    pub seed: u64,
    /// Whether each epoch's order is shuffled (else `0..len`).
    pub shuffle: bool,
    /// How shards are made equal when the world does not divide the dataset.
    pub remainder: Remainder,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions { world_size: 1, rank: 0, seed: 0, shuffle: true, remainder: Remainder::Pad }
    }
}

/// One rank's view of a shuffled, sharded dataset.
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    world_size: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    remainder: Remainder,
    epoch: u64,
    /// The first position of the epoch's order this sampler shards.
    start: usize,
}

impl DistributedSampler {
    /// A sampler over `len` samples, placed and ordered by `options`; an
    /// error for an empty world or a rank outside it.
    pub fn new(len: usize, options: SamplerOptions) -> Result<Self, SamplerError> {
        let SamplerOptions { world_size, rank, seed, shuffle, remainder } = options;
        if world_size == 0 {
            return Err(SamplerError::EmptyWorld);
        }
        if rank >= world_size {
            return Err(SamplerError::RankOutOfRange { rank, world_size });
        }
        Ok(DistributedSampler { len, world_size, rank, shuffle, seed, remainder, epoch: 0, start: 0 })
    }

    /// Shards only the positions from `position` on of each epoch's order
    /// (clamped to its length): what is left of an epoch when an elastic
    /// world re-forms after `position` samples were applied. At 0 the
    /// sampler is [`DistributedSampler::new`]'s.
    pub fn starting_at(mut self, position: usize) -> Self {
        self.start = position.min(self.len);
        self
    }

    /// The first position of the epoch's order this sampler shards.
    pub fn start(&self) -> usize {
        self.start
    }

    /// Number of real (unpadded) positions this sampler's world shares.
    pub fn remaining(&self) -> usize {
        self.len - self.start
    }

    /// Sets the epoch: the order changes with it, identically on every rank.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The world size.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The base seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Number of samples every rank gets.
    pub fn shard_len(&self) -> usize {
        match self.remainder {
            Remainder::Pad => self.remaining().div_ceil(self.world_size),
            Remainder::Drop => self.remaining() / self.world_size,
        }
    }

    /// The epoch's order of every sample, unpadded: fixed by (seed, epoch),
    /// whatever the world.
    pub fn epoch_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = StreamKey::shuffle(ShuffleKey { seed: self.seed, epoch: self.epoch }).pcg64();
            shuffle(&mut order, &mut rng);
        }
        order
    }

    /// The order this world shards for the current epoch (the same on every
    /// rank): the epoch's order from the start position, padded by
    /// repeating its beginning or truncated to a multiple of the world size.
    pub fn global_order(&self) -> Vec<usize> {
        let mut order = self.epoch_order().split_off(self.start);
        let total = self.shard_len() * self.world_size;
        if total > order.len() && !order.is_empty() {
            let mut i = 0;
            while order.len() < total {
                order.push(order[i]);
                i += 1;
            }
        }
        order.truncate(total);
        order
    }

    /// This rank's sample indices for the current epoch.
    pub fn indices(&self) -> Vec<usize> {
        self.global_order().into_iter().skip(self.rank).step_by(self.world_size).collect()
    }
}

/// Uniform integer in `0..n` (Lemire's method, unbiased).
pub fn below<R: Rng + ?Sized>(rng: &mut R, n: u64) -> u64 {
    debug_assert!(n > 0);
    let mut m = u128::from(rng.next_u64()) * u128::from(n);
    if (m as u64) < n {
        let t = n.wrapping_neg() % n;
        while (m as u64) < t {
            m = u128::from(rng.next_u64()) * u128::from(n);
        }
    }
    (m >> 64) as u64
}

/// Fisher-Yates shuffle.
pub fn shuffle<T, R: Rng + ?Sized>(items: &mut [T], rng: &mut R) {
    for i in (1..items.len()).rev() {
        let j = below(rng, i as u64 + 1) as usize;
        items.swap(i, j);
    }
}

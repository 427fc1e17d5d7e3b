//! MLM-style masking used as augmentation: each maskable position is chosen with
//! probability `p`; a chosen position becomes `[MASK]` (80%), a random token (10%)
//! or stays (10%). Labels are never touched.
//!
//! Like the collate function of the story, the masker draws exactly one 64-bit
//! number for **every position of the padded row**, maskable or not. The stream's
//! consumption therefore depends only on the row width, not on the data: two
//! identical streams produce identical mask patterns even on different sentences.
//! That is what makes the naive seeding reproduce the bug faithfully, and what makes
//! a per-sample stream's mask independent of the batch it lands in.
//!
//! The low 32 bits of the draw decide "chosen" (`low < p * 2^32`); the high 32 bits
//! decide the action, and for a random token they are reused, rescaled, to pick the
//! token: within the random-token band of width `w = 0.1 * 2^32` the offset is
//! uniform, and `offset * vocab / w` picks a token with a bias below `vocab / w`
//! (7e-5 for BERT's 30,522 tokens).

use rand_core::Rng;

/// What the masker did at a position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum MaskAction {
    /// Not chosen.
    #[default]
    None = 0,
    /// Replaced by `[MASK]`.
    Mask = 1,
    /// Replaced by a random token.
    Random = 2,
    /// Chosen, but left as it was.
    Keep = 3,
}

impl MaskAction {
    /// Whether the position was chosen (whatever was done with it).
    #[inline]
    pub fn is_chosen(self) -> bool {
        self != MaskAction::None
    }
}

/// Masking parameters.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MaskConfig {
    /// Probability that a maskable position is chosen (0.15 in BERT).
    pub probability: f64,
    /// Fraction of chosen positions replaced by `[MASK]`.
    pub mask_fraction: f64,
    /// Fraction of chosen positions replaced by a random token.
    pub random_fraction: f64,
    /// Fraction of chosen positions left unchanged.
    pub keep_fraction: f64,
    /// Choose whole words: every subword of a word shares its first subword's
    /// choice (each chosen subword still gets its own 80/10/10 action).
    pub whole_word: bool,
}

impl Default for MaskConfig {
    fn default() -> Self {
        MaskConfig {
            probability: 0.15,
            mask_fraction: 0.8,
            random_fraction: 0.1,
            keep_fraction: 0.1,
            whole_word: false,
        }
    }
}

/// Masking parameters that do not make sense.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MaskConfigError {
    /// A probability or fraction outside [0, 1] or not a number.
    #[error("mask {field} must be a number in [0, 1], found {value}")]
    OutOfRange {
        /// Which parameter.
        field: &'static str,
        /// Its value.
        value: f64,
    },
    /// The three fractions do not add up to one.
    #[error("mask fractions must sum to 1: mask {mask} + random {random} + keep {keep} = {sum}")]
    BadSum {
        /// `[MASK]` fraction.
        mask: f64,
        /// Random-token fraction.
        random: f64,
        /// Keep fraction.
        keep: f64,
        /// Their sum.
        sum: f64,
    },
    /// A vocabulary that cannot hold the mask token.
    #[error("mask token id {mask_token} is outside the vocabulary of {vocab_size} tokens")]
    BadVocab {
        /// The mask token.
        mask_token: u32,
        /// The vocabulary size.
        vocab_size: u32,
    },
}

impl MaskConfig {
    /// Checks ranges and that the fractions sum to 1 (within 1e-9).
    pub fn validate(&self) -> Result<(), MaskConfigError> {
        for (field, value) in [
            ("probability", self.probability),
            ("mask_fraction", self.mask_fraction),
            ("random_fraction", self.random_fraction),
            ("keep_fraction", self.keep_fraction),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(MaskConfigError::OutOfRange { field, value });
            }
        }
        let sum = self.mask_fraction + self.random_fraction + self.keep_fraction;
        if (sum - 1.0).abs() > 1e-9 {
            return Err(MaskConfigError::BadSum {
                mask: self.mask_fraction,
                random: self.random_fraction,
                keep: self.keep_fraction,
                sum,
            });
        }
        Ok(())
    }
}

const TWO_32: f64 = 4_294_967_296.0;

fn threshold(fraction: f64) -> u64 {
    (fraction * TWO_32).round() as u64
}

/// A validated masker for one vocabulary.
#[derive(Clone, Debug)]
pub struct Masker {
    config: MaskConfig,
    choose: u64,
    mask_below: u64,
    random_below: u64,
    mask_token: u32,
    vocab_size: u64,
}

impl Masker {
    /// Builds a masker; fails if the configuration or the vocabulary is invalid.
    pub fn new(config: MaskConfig, mask_token: u32, vocab_size: u32) -> Result<Self, MaskConfigError> {
        config.validate()?;
        if mask_token >= vocab_size {
            return Err(MaskConfigError::BadVocab { mask_token, vocab_size });
        }
        let mask_below = threshold(config.mask_fraction);
        let random_below = threshold(config.mask_fraction + config.random_fraction).max(mask_below);
        Ok(Masker {
            config,
            choose: threshold(config.probability),
            mask_below,
            random_below,
            mask_token,
            vocab_size: u64::from(vocab_size),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MaskConfig {
        &self.config
    }

    /// Masks one padded row in place, drawing one `u64` per position.
    ///
    /// - `ids`: the row's token ids, modified in place;
    /// - `maskable`: false for special tokens and padding, which are never chosen;
    /// - `continues_word`: for whole-word masking, true where a position is a
    ///   non-first subword of the previous position's word (ignored otherwise);
    /// - `actions`: receives what was done at each position.
    ///
    /// # Panics
    /// If the slices differ in length.
    pub fn mask_row<R: Rng + ?Sized>(
        &self,
        ids: &mut [u32],
        maskable: &[bool],
        continues_word: Option<&[bool]>,
        actions: &mut [MaskAction],
        rng: &mut R,
    ) {
        let n = ids.len();
        assert_eq!(maskable.len(), n, "maskable must cover the row");
        assert_eq!(actions.len(), n, "actions must cover the row");
        match continues_word {
            Some(cont) if self.config.whole_word => {
                assert_eq!(cont.len(), n, "continues_word must cover the row");
                let mut previous = false;
                for i in 0..n {
                    let x = rng.next_u64();
                    let drawn = (x & 0xffff_ffff) < self.choose;
                    let chosen = maskable[i] && if cont[i] { previous } else { drawn };
                    previous = chosen;
                    actions[i] = self.apply(chosen, x, &mut ids[i]);
                }
            }
            _ => {
                for i in 0..n {
                    let x = rng.next_u64();
                    let chosen = maskable[i] & ((x & 0xffff_ffff) < self.choose);
                    actions[i] = self.apply(chosen, x, &mut ids[i]);
                }
            }
        }
    }

    #[inline(always)]
    fn apply(&self, chosen: bool, x: u64, id: &mut u32) -> MaskAction {
        if !chosen {
            return MaskAction::None;
        }
        let high = x >> 32;
        if high < self.mask_below {
            *id = self.mask_token;
            MaskAction::Mask
        } else if high < self.random_below {
            let width = self.random_below - self.mask_below;
            *id = ((high - self.mask_below) * self.vocab_size / width) as u32;
            MaskAction::Random
        } else {
            MaskAction::Keep
        }
    }
}

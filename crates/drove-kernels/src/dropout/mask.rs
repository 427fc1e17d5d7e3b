//! [`Mask`]: which elements one dropout call keeps, as a pure function of
//! (seed, call, row), and its values drawn on the host.
//!
//! Each row of a dropped tensor (its first dimension, the batch row) draws
//! from its own SplitMix64 stream: the seed moved by the call's place in the
//! forward pass and the row's index in the whole batch, scrambled once. Draw
//! `k` of a row gives the mask of elements `2k` (its low 32 bits) and `2k + 1`
//! (its high 32 bits) of that row, kept when below `keep * 2^32`. SplitMix64 is
//! counter-based (draw `k` is `mix(state + (k + 1) * GAMMA)`), so the device
//! computes any element's value alone, and a micro-batch whose rows start at
//! `first_row` gets exactly the masks of the unsplit batch.

/// SplitMix64's increment (the golden ratio's 64 bits).
pub(crate) const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// Moves a stream's seed by the call's place in the forward pass.
pub(crate) const CALL_KEY: u64 = 0xD1B5_4A32_D192_ED03;
/// Moves a stream's seed by the row's index in the whole batch.
pub(crate) const ROW_KEY: u64 = 0x8CB9_2BA7_2F3D_8DD7;
/// SplitMix64's two multipliers.
pub(crate) const MIX: [u64; 2] = [0xBF58_476D_1CE4_E5B9, 0x94D0_49BB_1331_11EB];

/// One dropout call's mask: the stream key and the probability of keeping an
/// element. Values kept are scaled by `1 / keep`, dropped ones are 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mask {
    /// The seed of the forward pass (a function of seed, rank and step).
    pub seed: u64,
    /// The call's place in the forward pass since seeding, from 0.
    pub call: u64,
    /// The index in the whole batch of the tensor's first row.
    pub first_row: u64,
    /// The probability of keeping an element, in `[0, 1]`.
    pub keep: f64,
}

/// SplitMix64's output function.
#[inline]
pub(crate) fn mix(state: u64) -> u64 {
    let z = (state ^ (state >> 30)).wrapping_mul(MIX[0]);
    let z = (z ^ (z >> 27)).wrapping_mul(MIX[1]);
    z ^ (z >> 31)
}

impl Mask {
    /// Elements kept are those whose 32 random bits lie below this.
    pub fn threshold(&self) -> u64 {
        (self.keep * 4_294_967_296.0) as u64
    }

    /// The value of a kept element.
    pub fn scale(&self) -> f32 {
        (1.0 / self.keep) as f32
    }

    /// The seed moved by the call, before the row's part (what the device
    /// gets as its key).
    pub(crate) fn call_key(&self) -> u64 {
        self.seed ^ self.call.wrapping_add(1).wrapping_mul(CALL_KEY)
    }

    /// Row `row`'s stream state before its first draw (`row` counted from
    /// the tensor's first row).
    pub(crate) fn row_state(&self, row: u64) -> u64 {
        let moved = self.call_key() ^ (self.first_row + row).wrapping_add(1).wrapping_mul(ROW_KEY);
        mix(moved.wrapping_add(GAMMA))
    }

    /// The mask of a tensor of `rows` rows of `per_row` elements each,
    /// row-major: `scale()` where kept, 0 where dropped.
    pub fn host_values(&self, rows: usize, per_row: usize) -> Vec<f32> {
        let (threshold, scale) = (self.threshold(), self.scale());
        let mut mask = Vec::with_capacity(rows * per_row);
        for row in 0..rows as u64 {
            let mut state = self.row_state(row);
            let mut i = 0;
            while i < per_row {
                state = state.wrapping_add(GAMMA);
                let r = mix(state);
                for half in [r & 0xffff_ffff, r >> 32] {
                    if i < per_row {
                        mask.push(if half < threshold { scale } else { 0.0 });
                        i += 1;
                    }
                }
            }
        }
        mask
    }

    /// The rows and elements a row of a tensor of shape `dims` has: its first
    /// dimension is the batch row (a scalar or empty shape is one row).
    pub fn rows_of(dims: &[usize]) -> (usize, usize) {
        let n: usize = dims.iter().product();
        let rows = dims.first().copied().unwrap_or(1).max(1);
        (rows, n / rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first values of a mask as drove-bert's host path drew them before
    /// the draw moved here (drove-bert 796de46, `dropout.rs`), computed by an
    /// independent transcription of that code: the draw must never change.
    #[test]
    fn repeats_the_masks_drove_drew_before() {
        let mask = Mask { seed: 7, call: 2, first_row: 3, keep: 0.5 };
        let values = mask.host_values(2, 5);
        let kept: Vec<bool> = values.iter().map(|&v| v != 0.0).collect();
        assert_eq!(kept, EXPECTED_KEPT);
        assert!(values.iter().all(|&v| v == 0.0 || v == 2.0));
    }

    const EXPECTED_KEPT: [bool; 10] = [false, true, true, true, false, false, true, true, false, false];

    #[test]
    fn keeps_the_right_fraction() {
        let mask = Mask { seed: 11, call: 0, first_row: 0, keep: 0.9 };
        let values = mask.host_values(100, 1000);
        let kept = values.iter().filter(|&&v| v != 0.0).count() as f64 / values.len() as f64;
        // 100,000 Bernoulli(0.9) draws: sigma 0.00095.
        assert!((kept - 0.9).abs() < 0.004, "kept {kept}");
    }

    #[test]
    fn a_split_batch_gets_the_rows_of_the_whole_one() {
        let whole = Mask { seed: 5, call: 1, first_row: 0, keep: 0.7 }.host_values(6, 9);
        let tail = Mask { seed: 5, call: 1, first_row: 4, keep: 0.7 }.host_values(2, 9);
        assert_eq!(&whole[4 * 9..], &tail[..]);
    }
}

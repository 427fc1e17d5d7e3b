//! The effect: the MLM masks of the batches the ranks fetched at the same
//! point of the same loader's epoch, compared position by position by the
//! diagnostic's own rule (drove-diagnostic's `AgreementAccumulator`: the
//! 3-sigma band of independent masks around `p^2 + (1-p)^2`).
//!
//! A generator no fingerprint sees (a collator's own `seed=`) still masks
//! alike on every rank, and this sees it.

use std::collections::BTreeMap;

use drove_diagnostic::{AgreementAccumulator, AgreementReport, RowMasks};

use crate::note::LoaderEpoch;

/// Batches waiting for a rank are dropped past this many (a rank that
/// stopped sending, or a loader only some ranks iterate).
const PENDING: usize = 64;

/// One comparison of the ranks' masks of one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct MaskComparison {
    /// The loader's epoch.
    pub at: LoaderEpoch,
    /// The batch's index in it.
    pub batch: u64,
    /// The diagnostic's report: agreement, band and verdict.
    pub report: AgreementReport,
}

/// Masks by batch until every rank's is there.
#[derive(Debug)]
pub struct BatchMasks {
    world_size: usize,
    pending: BTreeMap<(LoaderEpoch, u64), Vec<Option<RowMasks>>>,
}

impl BatchMasks {
    /// For a world of `world_size` ranks.
    pub fn new(world_size: usize) -> Self {
        BatchMasks { world_size, pending: BTreeMap::new() }
    }

    /// Adds rank `rank`'s mask of a batch; when it is the last rank's, the comparison.
    pub fn add(
        &mut self,
        rank: usize,
        at: LoaderEpoch,
        batch: u64,
        masks: RowMasks,
    ) -> Option<MaskComparison> {
        if rank >= self.world_size || self.world_size < 2 {
            return None;
        }
        let slots = self.pending.entry((at, batch)).or_insert_with(|| vec![None; self.world_size]);
        slots[rank] = Some(masks);
        if slots.iter().any(Option::is_none) {
            while self.pending.len() > PENDING {
                self.pending.pop_first();
            }
            return None;
        }
        let every: Vec<RowMasks> = self.pending.remove(&(at, batch))?.into_iter().flatten().collect();
        let probability = chosen_fraction(&every)?;
        let mut accumulator = AgreementAccumulator::new(self.world_size, probability);
        accumulator.add_step(&every);
        Some(MaskComparison { at, batch, report: accumulator.report() })
    }
}

/// The fraction of maskable positions chosen, over every rank's mask: the
/// masking probability the program used, which the watcher is never told.
fn chosen_fraction(masks: &[RowMasks]) -> Option<f64> {
    let (mut chosen, mut maskable) = (0u64, 0u64);
    for m in masks {
        for (c, can) in m.chosen.iter().zip(&m.maskable) {
            maskable += u64::from(*can);
            chosen += u64::from(*c && *can);
        }
    }
    (maskable > 0).then(|| chosen as f64 / maskable as f64)
}

#[cfg(test)]
mod tests {
    use drove_diagnostic::Verdict;

    use super::*;

    /// `rows x width` masks with probability 0.15 from a small generator.
    fn random_masks(seed: u64, rows: usize, width: usize) -> RowMasks {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let chosen = (0..rows * width)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64 <= 0.15
            })
            .collect();
        RowMasks { width, chosen, maskable: vec![true; rows * width] }
    }

    const AT: LoaderEpoch = LoaderEpoch { loader: 0, epoch: 1 };

    #[test]
    fn the_same_masks_on_every_rank_are_identical_and_each_rank_s_own_are_diverse() {
        let mut same = BatchMasks::new(4);
        for rank in 0..3 {
            assert!(same.add(rank, AT, 20, random_masks(7, 32, 64)).is_none(), "rank 3 is still missing");
        }
        let c = same.add(3, AT, 20, random_masks(7, 32, 64)).expect("every rank's mask is there");
        assert_eq!((c.at, c.batch, c.report.verdict), (AT, 20, Verdict::Identical));
        assert!(c.report.is_alarm() && c.report.mean_agreement == 1.0);

        let mut own = BatchMasks::new(4);
        let last =
            (0..4).filter_map(|rank| own.add(rank, AT, 20, random_masks(rank as u64 + 1, 32, 64))).last();
        let report = last.expect("a comparison").report;
        assert_eq!(report.verdict, Verdict::Diverse, "{report:?}");
        assert!((report.mean_agreement - 0.745).abs() < 0.02, "{}", report.mean_agreement);
    }

    #[test]
    fn a_batch_waits_for_every_rank_and_old_ones_are_dropped() {
        let mut masks = BatchMasks::new(2);
        for batch in 0..(PENDING as u64 + 10) {
            assert!(masks.add(0, AT, batch, random_masks(batch, 2, 8)).is_none());
        }
        assert_eq!(masks.pending.len(), PENDING);
        assert!(masks.add(1, AT, 0, random_masks(0, 2, 8)).is_none(), "batch 0 was dropped");
        assert!(masks.add(1, AT, PENDING as u64 + 9, random_masks(1, 2, 8)).is_some());
        assert!(
            BatchMasks::new(1).add(0, AT, 0, random_masks(0, 2, 8)).is_none(),
            "one rank compares nothing"
        );
    }
}

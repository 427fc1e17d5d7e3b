//! Every note in, what it completes out: the census of streams (the cause)
//! and the batches' masks (the effect), with the fix for each alarm.

use crate::census::StreamCensus;
use crate::finding::{Finding, Fix};
use crate::masks::{BatchMasks, MaskComparison};
use crate::note::Note;

/// Comparisons in a row beyond the band that make the mask alarm: one alone
/// is beyond a 3-sigma band 0.27% of the time with independent masks, which a
/// long run compared every few batches would reach; three in a row, about
/// 2e-8 of the time. The story's masks are beyond it every time.
pub const CONFIRMATIONS: u32 = 3;

/// What one note completed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completed {
    /// Alarms, each with its fix.
    pub alarms: Vec<(Finding, Fix)>,
    /// A comparison of every rank's mask of one batch, alarm or not.
    pub compared: Option<MaskComparison>,
}

/// Compares the notes of one world's ranks as they come.
#[derive(Debug)]
pub struct NoteComparer {
    census: StreamCensus,
    masks: BatchMasks,
    streams_shared: bool,
    masks_alarmed: bool,
    beyond_in_a_row: u32,
}

impl NoteComparer {
    /// For a world of `world_size` ranks.
    pub fn new(world_size: usize) -> Self {
        NoteComparer {
            census: StreamCensus::new(),
            masks: BatchMasks::new(world_size),
            streams_shared: false,
            masks_alarmed: false,
            beyond_in_a_row: 0,
        }
    }

    /// Adds one note. A stream alarm is raised once a (loader, stream); the
    /// mask alarm once a run, at the [`CONFIRMATIONS`]th comparison in a row
    /// beyond the band (every comparison is returned all the same).
    pub fn add(&mut self, note: Note) -> Completed {
        let mut done = Completed::default();
        for shared in self.census.add(&note) {
            let finding = Finding::SharedStream(shared);
            let fix = finding.fix(self.streams_shared);
            self.streams_shared = true;
            done.alarms.push((finding, fix));
        }
        if let Note::Mask { rank, at, batch, masks } = note {
            done.compared = self.masks.add(rank, at, batch, masks);
            if let Some(c) = &done.compared {
                self.beyond_in_a_row = if c.report.is_alarm() { self.beyond_in_a_row + 1 } else { 0 };
            }
            if let Some(c) = &done.compared
                && self.beyond_in_a_row >= CONFIRMATIONS
                && !self.masks_alarmed
            {
                self.masks_alarmed = true;
                let finding = Finding::Masks(c.clone());
                let fix = finding.fix(self.streams_shared);
                done.alarms.push((finding, fix));
            }
        }
        done
    }

    /// Every stream alarm raised, in full (for the end of a run: an alarm is
    /// raised at its first two members).
    pub fn alarms(&self) -> Vec<Finding> {
        self.census.alarms().into_iter().map(Finding::SharedStream).collect()
    }

    /// The streams shared but never drawn from (warnings, for the end of a run).
    pub fn warnings(&self) -> Vec<Finding> {
        self.census.warnings().into_iter().map(Finding::SharedStream).collect()
    }
}

#[cfg(test)]
mod tests {
    use drove_diagnostic::RowMasks;

    use super::*;
    use crate::note::LoaderEpoch;

    /// Rank `rank`'s mask of batch `batch`: every rank alike (`same`), or its own.
    fn mask(rank: usize, batch: u64, same: bool) -> Note {
        let seed = if same { batch } else { batch * 100 + rank as u64 + 1 };
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let chosen = (0..32 * 64)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64 <= 0.15
            })
            .collect();
        let masks = RowMasks { width: 64, chosen, maskable: vec![true; 32 * 64] };
        Note::Mask { rank, at: LoaderEpoch { loader: 0, epoch: 0 }, batch, masks }
    }

    /// The alarms after each comparison of a run whose batches are alike or not.
    fn alarms_by_batch(alike: &[bool]) -> Vec<usize> {
        let mut comparer = NoteComparer::new(2);
        alike
            .iter()
            .enumerate()
            .map(|(batch, same)| {
                let done: Vec<Completed> =
                    (0..2).map(|rank| comparer.add(mask(rank, batch as u64, *same))).collect();
                assert!(done[1].compared.is_some(), "the second rank's mask completes batch {batch}");
                done.iter().map(|d| d.alarms.len()).sum()
            })
            .collect()
    }

    #[test]
    fn the_mask_alarm_takes_three_comparisons_in_a_row_beyond_the_band_and_comes_once() {
        // Identical masks every time: the alarm at the third comparison, then never again.
        assert_eq!(alarms_by_batch(&[true; 5]), [0, 0, 1, 0, 0]);
        // A diverse comparison between starts the count again.
        assert_eq!(alarms_by_batch(&[true, true, false, true, true, true]), [0, 0, 0, 0, 0, 1]);
        assert_eq!(alarms_by_batch(&[false; 4]), [0; 4]);
    }
}

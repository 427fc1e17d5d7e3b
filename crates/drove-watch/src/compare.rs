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

//! `--trace-samples FILE`: which samples every applied step used, and how
//! they were masked, so a run's coverage of an epoch can be checked: every
//! position exactly once across re-forms, the same masks at any world size.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use drove_collate::Batch;

use crate::NerError;

/// One rank's applied step, as one JSON line.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceLine {
    /// The epoch (0-based).
    pub epoch: usize,
    /// The optimizer step it was (1-based).
    pub step: u64,
    /// The elastic run's generation (0: a fixed world).
    pub generation: u64,
    /// The world size that took the step.
    pub world: usize,
    /// This rank.
    pub rank: usize,
    /// Each real row's (sample id, mask hash): rows padding the epoch's last
    /// step are left out.
    pub samples: Vec<(usize, u64)>,
}

/// The trace file, opened for appending (every rank of a run writes whole
/// lines to the same file).
pub(crate) struct SampleTrace {
    file: File,
    path: PathBuf,
}

impl SampleTrace {
    pub(crate) fn open(path: &Path) -> Result<SampleTrace, NerError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| NerError::Output { path: path.to_path_buf(), message: e.to_string() })?;
        Ok(SampleTrace { file, path: path.to_path_buf() })
    }

    /// Writes `line` in one `write` (O_APPEND keeps ranks' lines whole).
    pub(crate) fn record(&mut self, line: &TraceLine) -> Result<(), NerError> {
        let mut text = serde_json::to_vec(line).expect("a trace line serialises");
        text.push(b'\n');
        self.file
            .write_all(&text)
            .map_err(|e| NerError::Output { path: self.path.clone(), message: e.to_string() })
    }
}

/// A hash of row `row`'s token ids after masking, over its real tokens (so
/// the padding of the batch it landed in does not change it).
pub fn mask_hash(batch: &Batch, row: usize) -> u64 {
    let span = batch.row(row);
    batch.input_ids[span.clone()]
        .iter()
        .zip(&batch.attention_mask[span])
        .filter(|&(_, &m)| m != 0)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, (&id, _)| (h ^ u64::from(id)).wrapping_mul(0x100_0000_01b3))
}

//! Token-classification collation: dynamic padding (optionally to a multiple of 8)
//! or fixed padding, labels aligned with [`IGNORE_LABEL`] on padding, masking of
//! the inputs as augmentation, and length-bucketed batching.

use drove_seed::{Pcg64, SampleStreams, ShuffleKey, StreamKey};

use crate::example::IGNORE_LABEL;
use crate::mask::{MaskAction, Masker};
use crate::sampler::shuffle;

pub use crate::example::Example;

/// How rows are padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Padding {
    /// To the longest row of the batch, rounded up to a multiple (1: no rounding;
    /// 8 suits tensor cores).
    Longest {
        /// Round the width up to a multiple of this (at least 1).
        multiple_of: usize,
    },
    /// Every batch to this width (as `padding="max_length"`).
    Fixed(usize),
}

impl Default for Padding {
    fn default() -> Self {
        Padding::Longest { multiple_of: 1 }
    }
}

/// A batch that cannot be formed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CollateError {
    /// A row is longer than the fixed width.
    #[error("sample {sample} has {len} tokens, more than the fixed padding width {width}")]
    TooLong {
        /// Global index of the sample.
        sample: usize,
        /// Its length.
        len: usize,
        /// The fixed width.
        width: usize,
    },
    /// No rows.
    #[error("cannot collate an empty batch")]
    Empty,
    /// The sample indices do not match the examples.
    #[error("{examples} examples but {indices} sample indices")]
    IndexMismatch {
        /// Number of examples.
        examples: usize,
        /// Number of indices.
        indices: usize,
    },
}

/// Where each row's mask draws come from.
pub enum MaskSource<'a> {
    /// No masking.
    None,
    /// Row `i` draws from the per-sample stream of its global sample index.
    PerSample(&'a SampleStreams),
    /// Rows draw, in order, from one sequential stream (a loader worker's).
    Sequential(&'a mut Pcg64),
}

/// A padded, masked batch, row-major `[batch_size, seq_len]`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Batch {
    /// Rows.
    pub batch_size: usize,
    /// Padded width.
    pub seq_len: usize,
    /// Token ids after masking.
    pub input_ids: Vec<u32>,
    /// 1 on real tokens, 0 on padding.
    pub attention_mask: Vec<u8>,
    /// Labels, untouched by masking; [`IGNORE_LABEL`] on padding.
    pub labels: Vec<i64>,
    /// Positions that could be masked (real, non-special tokens).
    pub maskable: Vec<bool>,
    /// What the masker did at each position.
    pub actions: Vec<MaskAction>,
    /// Global sample index of each row.
    pub indices: Vec<usize>,
}

impl Batch {
    /// Range of row `i` in the flat vectors.
    pub fn row(&self, i: usize) -> std::ops::Range<usize> {
        i * self.seq_len..(i + 1) * self.seq_len
    }

    /// Number of real (non-padding) tokens.
    pub fn real_tokens(&self) -> usize {
        self.attention_mask.iter().map(|&a| usize::from(a)).sum()
    }

    /// Number of positions chosen by the masker.
    pub fn chosen(&self) -> usize {
        self.actions.iter().filter(|a| a.is_chosen()).count()
    }

    /// Rows `rows` as a batch of their own, at the same padded width.
    ///
    /// # Panics
    /// If the range runs past `batch_size`.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> Batch {
        assert!(rows.end <= self.batch_size, "rows {rows:?} of a batch of {}", self.batch_size);
        let flat = rows.start * self.seq_len..rows.end * self.seq_len;
        Batch {
            batch_size: rows.len(),
            seq_len: self.seq_len,
            input_ids: self.input_ids[flat.clone()].to_vec(),
            attention_mask: self.attention_mask[flat.clone()].to_vec(),
            labels: self.labels[flat.clone()].to_vec(),
            maskable: self.maskable[flat.clone()].to_vec(),
            actions: self.actions[flat].to_vec(),
            indices: self.indices[rows].to_vec(),
        }
    }

    /// Splits the rows into at most `parts` contiguous micro-batches of
    /// near-equal size (the first ones one row larger), each with the index of
    /// its first row; empty parts are left out.
    pub fn split(&self, parts: usize) -> Vec<(usize, Batch)> {
        let parts = parts.clamp(1, self.batch_size.max(1));
        let (base, extra) = (self.batch_size / parts, self.batch_size % parts);
        let mut start = 0;
        let mut out = Vec::with_capacity(parts);
        for p in 0..parts {
            let len = base + usize::from(p < extra);
            if len > 0 {
                out.push((start, self.rows(start..start + len)));
            }
            start += len;
        }
        out
    }
}

/// Pads, aligns and masks batches of [`Example`]s.
#[derive(Clone, Debug)]
pub struct Collator {
    pad_id: u32,
    padding: Padding,
    masker: Option<Masker>,
    stream_width: usize,
}

impl Collator {
    /// A collator padding with `pad_id`; masking only if a masker is given.
    pub fn new(pad_id: u32, padding: Padding, masker: Option<Masker>) -> Self {
        let padding = match padding {
            Padding::Longest { multiple_of } => Padding::Longest { multiple_of: multiple_of.max(1) },
            fixed => fixed,
        };
        Collator { pad_id, padding, masker, stream_width: 0 }
    }

    /// Makes a sequential mask stream advance by at least `width` draws per row,
    /// whatever the padded width: as if every row were padded to `width` (the
    /// tokenizer's maximum length), so how far a stream has advanced never
    /// depends on the data. Per-sample streams are unaffected.
    pub fn with_stream_width(mut self, width: usize) -> Self {
        self.stream_width = width;
        self
    }

    /// The masker, if any.
    pub fn masker(&self) -> Option<&Masker> {
        self.masker.as_ref()
    }

    /// The padding policy.
    pub fn padding(&self) -> Padding {
        self.padding
    }

    /// Width a batch of rows with these lengths gets.
    pub fn width(&self, longest: usize) -> usize {
        match self.padding {
            Padding::Longest { multiple_of } => longest.div_ceil(multiple_of) * multiple_of,
            Padding::Fixed(width) => width,
        }
    }

    /// Collates `examples` (global sample indices `indices`) into a batch, masking
    /// the inputs from `source`. Masks are drawn per position of the padded row.
    pub fn collate(
        &self,
        examples: &[&Example],
        indices: &[usize],
        source: MaskSource<'_>,
    ) -> Result<Batch, CollateError> {
        let mut batch = Batch::default();
        self.collate_into(examples, indices, source, &mut batch)?;
        Ok(batch)
    }

    /// As [`Collator::collate`], reusing the allocations of `batch`.
    pub fn collate_into(
        &self,
        examples: &[&Example],
        indices: &[usize],
        mut source: MaskSource<'_>,
        batch: &mut Batch,
    ) -> Result<(), CollateError> {
        if examples.is_empty() {
            return Err(CollateError::Empty);
        }
        if examples.len() != indices.len() {
            return Err(CollateError::IndexMismatch { examples: examples.len(), indices: indices.len() });
        }
        let longest = examples.iter().map(|e| e.len()).max().unwrap_or(0);
        let width = self.width(longest);
        if let Padding::Fixed(width) = self.padding
            && let Some((e, &sample)) = examples.iter().zip(indices).find(|(e, _)| e.len() > width)
        {
            return Err(CollateError::TooLong { sample, len: e.len(), width });
        }
        let n = examples.len() * width;
        batch.batch_size = examples.len();
        batch.seq_len = width;
        reset(&mut batch.input_ids, n, self.pad_id);
        reset(&mut batch.attention_mask, n, 0);
        reset(&mut batch.labels, n, IGNORE_LABEL);
        reset(&mut batch.maskable, n, false);
        reset(&mut batch.actions, n, MaskAction::None);
        batch.indices.clear();
        batch.indices.extend_from_slice(indices);

        let whole_word = self.masker.as_ref().is_some_and(|m| m.config().whole_word);
        let mut continues = if whole_word { vec![false; width] } else { Vec::new() };
        for (r, (example, &sample)) in examples.iter().zip(indices).enumerate() {
            let row = r * width..(r + 1) * width;
            let len = example.len();
            let start = row.start;
            batch.input_ids[start..start + len].copy_from_slice(&example.input_ids);
            batch.labels[start..start + len].copy_from_slice(&example.labels);
            batch.attention_mask[start..start + len].fill(1);
            for (m, &s) in batch.maskable[start..start + len].iter_mut().zip(&example.special) {
                *m = !s;
            }
            let Some(masker) = &self.masker else { continue };
            let cont = if whole_word {
                continues.fill(false);
                for (i, c) in continues.iter_mut().enumerate().take(len).skip(1) {
                    *c = !example.special[i]
                        && example.word_ids[i].is_some()
                        && example.word_ids[i] == example.word_ids[i - 1];
                }
                Some(continues.as_slice())
            } else {
                None
            };
            let ids = &mut batch.input_ids[row.clone()];
            let maskable = &batch.maskable[row.clone()];
            let actions = &mut batch.actions[row];
            match &mut source {
                MaskSource::None => {}
                MaskSource::PerSample(streams) => {
                    let mut rng = streams.stream(sample as u64);
                    masker.mask_row(ids, maskable, cont, actions, &mut rng);
                }
                MaskSource::Sequential(rng) => {
                    masker.mask_row(ids, maskable, cont, actions, *rng);
                    if self.stream_width > width {
                        rng.advance((self.stream_width - width) as u128);
                    }
                }
            }
        }
        Ok(())
    }
}

fn reset<T: Clone>(v: &mut Vec<T>, n: usize, value: T) {
    v.clear();
    v.resize(n, value);
}

/// Length bucketing: sort windows of `window_batches` batches by length before
/// cutting batches, so rows of a batch have similar lengths and padding shrinks;
/// the batch order is then shuffled with a stream that is the same on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Bucketing {
    /// How many batches' worth of samples are sorted together (at least 1).
    pub window_batches: usize,
}

/// Cuts a rank's sample order into batches, optionally bucketed by length.
/// Every rank gets the same number of batches of the same sizes, provided their
/// shards have equal length (as [`crate::DistributedSampler`] guarantees).
pub fn make_batches(
    order: &[usize],
    length: impl Fn(usize) -> usize,
    batch_size: usize,
    drop_last: bool,
    bucketing: Option<Bucketing>,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    let batch_size = batch_size.max(1);
    let mut order = order.to_vec();
    if drop_last {
        order.truncate(order.len() / batch_size * batch_size);
    }
    let Some(bucketing) = bucketing else {
        return order.chunks(batch_size).map(<[usize]>::to_vec).collect();
    };
    let window = bucketing.window_batches.max(1) * batch_size;
    let mut batches = Vec::with_capacity(order.len().div_ceil(batch_size));
    for chunk in order.chunks_mut(window) {
        chunk.sort_by_key(|&i| length(i));
        batches.extend(chunk.chunks(batch_size).map(<[usize]>::to_vec));
    }
    // Keep a short last batch last, so batch sizes agree across ranks step by step.
    let short = batches.last().is_some_and(|b| b.len() < batch_size);
    let full = if short { batches.len() - 1 } else { batches.len() };
    let mut rng = StreamKey::shuffle(ShuffleKey { seed, epoch }).with_lane(1).pcg64();
    shuffle(&mut batches[..full], &mut rng);
    batches
}

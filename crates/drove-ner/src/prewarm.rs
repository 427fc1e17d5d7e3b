//! The pre-warm pass: before a GPU run's first step, one throw-away forward
//! and backward at each padded length the training data has, so that every
//! kernel a step needs is compiled (and, where cubecl autotunes, tuned)
//! before any step is taken, rather than in the middle of the run when a
//! batch first comes at a new length (the gap between the mean and the
//! median step that GPU-SPEED.md saw on the H200).
//!
//! The pass touches no parameter and no optimizer state: its gradients are
//! dropped. Its dropout draws come from the thread's stream, which every
//! step seeds afresh, so the run's masks are those of a run without it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Int, Tensor};
use drove_bert::{BertForTokenClassification, TokenTypes};
use drove_collate::{Collator, Example, Padding};

use crate::model::loss;
use crate::{NerOptions, Prewarm};

/// The padded lengths batches of `examples` can have: each example's length
/// rounded up to `multiple` (a batch's width is its longest row's, rounded
/// up), in increasing order.
pub(crate) fn padded_lengths(examples: &[Example], multiple: usize) -> Vec<usize> {
    let collator = Collator::new(0, Padding::Longest { multiple_of: multiple }, None);
    let widths: BTreeSet<usize> = examples.iter().map(|e| collator.width(e.input_ids.len())).collect();
    widths.into_iter().collect()
}

/// What the pass did: the lengths it ran and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Prewarmed {
    /// The padded lengths run, in increasing order.
    pub lengths: Vec<usize>,
    /// Wall time of the pass.
    pub took: Duration,
}

impl std::fmt::Display for Prewarmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, lengths, s) = (self.lengths.len(), &self.lengths, self.took.as_secs_f64());
        write!(f, "kernels compiled for {n} padded lengths {lengths:?} in {s:.1} s")
    }
}

/// The pass where `opts` asks for it (`--prewarm on`, the default) and the
/// backend has drove's GPU kernels (never on the CPU, which compiles
/// nothing): every padded length of `train` at `--batch-size` rows.
pub(crate) fn prewarm_as_asked<B: AutodiffBackend>(
    opts: &NerOptions,
    train: &[Example],
    model: &BertForTokenClassification<B>,
    device: &B::Device,
) -> Option<Prewarmed> {
    if opts.gpu_step.prewarm == Prewarm::Off || !drove_kernels::backends::has_kernels::<B>() {
        return None;
    }
    let lengths = padded_lengths(train, opts.pad_multiple.unwrap_or(1));
    Some(prewarm(model, lengths, opts.batch_size, device))
}

/// Runs `model` forward and backward once at each of `lengths` with `rows`
/// rows of padding tokens, every token labelled, and drops the gradients.
pub(crate) fn prewarm<B: AutodiffBackend>(
    model: &BertForTokenClassification<B>,
    lengths: Vec<usize>,
    rows: usize,
    device: &B::Device,
) -> Prewarmed {
    let started = Instant::now();
    let num_labels = model.num_labels();
    for &len in &lengths {
        let ids = Tensor::<B, 2, Int>::zeros([rows, len], device);
        let mask = Tensor::<B, 2>::ones([rows, len], device);
        let labels = vec![0i64; rows * len];
        let logits = model.forward(ids, TokenTypes::Zero, mask);
        drop(loss(logits, &labels, num_labels, 1.0, device).backward());
    }
    Prewarmed { lengths, took: started.elapsed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(len: usize) -> Example {
        Example {
            input_ids: vec![1; len],
            labels: vec![0; len],
            word_ids: vec![None; len],
            special: vec![false; len],
        }
    }

    #[test]
    fn lengths_are_rounded_up_to_the_multiple_once_each() {
        let examples: Vec<_> = [3, 16, 17, 5, 40, 31].into_iter().map(example).collect();
        assert_eq!(padded_lengths(&examples, 16), vec![16, 32, 48]);
        assert_eq!(padded_lengths(&examples, 1), vec![3, 5, 16, 17, 31, 40]);
        assert_eq!(padded_lengths(&[], 16), Vec::<usize>::new());
    }
}

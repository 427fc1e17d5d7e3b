//! Collation, bucketing and the worker pool.
use std::collections::HashMap;
use std::sync::Arc;

use drove_collate::diag::{SYNTHETIC_MASK, SYNTHETIC_PAD, SYNTHETIC_VOCAB, synthetic_examples};
use drove_collate::{
    Batch, Bucketing, CollateError, Collator, DistributedSampler, Example, IGNORE_LABEL, Loader,
    LoaderConfig, LoaderError, MaskAction, MaskConfig, MaskSeeding, MaskSource, Masker, Padding,
    SamplerOptions, make_batches,
};

fn masker() -> Masker {
    Masker::new(MaskConfig::default(), SYNTHETIC_MASK, SYNTHETIC_VOCAB).unwrap()
}

fn data(n: usize) -> Arc<[Example]> {
    synthetic_examples(n, 64, 7).into()
}

#[test]
fn dynamic_padding_rounds_to_a_multiple_and_pads_labels_with_ignore() {
    let d = data(3);
    let examples: Vec<&Example> = d.iter().collect();
    let longest = examples.iter().map(|e| e.len()).max().unwrap();
    let c = Collator::new(SYNTHETIC_PAD, Padding::Longest { multiple_of: 8 }, None);
    let b = c.collate(&examples, &[0, 1, 2], MaskSource::None).unwrap();
    assert_eq!(b.seq_len, longest.div_ceil(8) * 8);
    assert_eq!(b.seq_len % 8, 0);
    for (r, e) in examples.iter().enumerate() {
        let row = b.row(r);
        let (ids, labels, att) =
            (&b.input_ids[row.clone()], &b.labels[row.clone()], &b.attention_mask[row.clone()]);
        assert_eq!(&ids[..e.len()], e.input_ids.as_slice());
        assert_eq!(&labels[..e.len()], e.labels.as_slice());
        assert!(ids[e.len()..].iter().all(|&t| t == SYNTHETIC_PAD));
        assert!(labels[e.len()..].iter().all(|&l| l == IGNORE_LABEL));
        assert_eq!(att.iter().map(|&a| a as usize).sum::<usize>(), e.len());
        assert!(!b.maskable[row.start] && !b.maskable[row.start + e.len() - 1], "specials are not maskable");
    }
    assert_eq!(b.real_tokens(), examples.iter().map(|e| e.len()).sum::<usize>());
    let plain = Collator::new(SYNTHETIC_PAD, Padding::Longest { multiple_of: 1 }, None);
    assert_eq!(plain.collate(&examples, &[0, 1, 2], MaskSource::None).unwrap().seq_len, longest);
}

#[test]
fn masking_leaves_labels_untouched() {
    let d = data(64);
    let examples: Vec<&Example> = d.iter().collect();
    let indices: Vec<usize> = (0..64).collect();
    let c = Collator::new(SYNTHETIC_PAD, Padding::Fixed(64), Some(masker()));
    let plain = Collator::new(SYNTHETIC_PAD, Padding::Fixed(64), None);
    let streams = drove_seed::SampleStreams::new(1, drove_seed::Purpose::Augment, 0);
    let masked = c.collate(&examples, &indices, MaskSource::PerSample(&streams)).unwrap();
    let clean = plain.collate(&examples, &indices, MaskSource::None).unwrap();
    assert_eq!(masked.labels, clean.labels);
    assert!(masked.chosen() > 0);
    assert_ne!(masked.input_ids, clean.input_ids);
}

#[test]
fn a_batch_splits_into_micro_batches_that_concatenate_back() {
    let d = data(7);
    let examples: Vec<&Example> = d.iter().collect();
    let indices: Vec<usize> = (10..17).collect();
    let c = Collator::new(SYNTHETIC_PAD, Padding::Longest { multiple_of: 1 }, Some(masker()));
    let streams = drove_seed::SampleStreams::new(1, drove_seed::Purpose::Augment, 0);
    let whole = c.collate(&examples, &indices, MaskSource::PerSample(&streams)).unwrap();
    let parts = whole.split(3);
    // 7 rows in 3: 3, 2, 2, at the same width, starting where the last ended.
    let sizes: Vec<(usize, usize)> = parts.iter().map(|(first, b)| (*first, b.batch_size)).collect();
    assert_eq!(sizes, vec![(0, 3), (3, 2), (5, 2)]);
    let mut joined = Batch { seq_len: whole.seq_len, ..Batch::default() };
    for (_, p) in &parts {
        assert_eq!(p.seq_len, whole.seq_len);
        joined.batch_size += p.batch_size;
        joined.input_ids.extend(&p.input_ids);
        joined.attention_mask.extend(&p.attention_mask);
        joined.labels.extend(&p.labels);
        joined.maskable.extend(&p.maskable);
        joined.actions.extend(p.actions.iter().cloned());
        joined.indices.extend(&p.indices);
    }
    assert_eq!(joined, whole);
    // More parts than rows: one row each, no empty parts.
    assert_eq!(whole.split(10).len(), 7);
    assert_eq!(whole.split(0).len(), 1);
}

#[test]
fn fixed_padding_refuses_a_row_that_is_too_long() {
    let d = data(8);
    let examples: Vec<&Example> = d.iter().collect();
    let c = Collator::new(SYNTHETIC_PAD, Padding::Fixed(9), None);
    let indices: Vec<usize> = (100..108).collect();
    let err = c.collate(&examples, &indices, MaskSource::None).unwrap_err();
    assert!(matches!(err, CollateError::TooLong { width: 9, .. }), "{err}");
    assert!(err.to_string().contains("sample 10"), "names the global sample: {err}");
    assert_eq!(c.collate(&[], &[], MaskSource::None).unwrap_err(), CollateError::Empty);
}

/// Mask of each sample's real tokens, over a whole epoch of every rank.
fn masks_by_sample(
    world: usize,
    workers: usize,
    batch: usize,
    seeding: MaskSeeding,
) -> HashMap<usize, Vec<MaskAction>> {
    let d = data(200);
    let collator =
        Arc::new(Collator::new(SYNTHETIC_PAD, Padding::Longest { multiple_of: 8 }, Some(masker())));
    let mut out = HashMap::new();
    for rank in 0..world {
        let sampler = DistributedSampler::new(
            d.len(),
            SamplerOptions { world_size: world, rank, seed: 42, ..SamplerOptions::default() },
        )
        .unwrap();
        let cfg = LoaderConfig { batch_size: batch, workers, seeding, ..LoaderConfig::default() };
        let loader = Loader::new(Arc::clone(&d), sampler, Arc::clone(&collator), cfg).unwrap();
        for b in loader.epoch(0) {
            let b = b.unwrap();
            for (r, &sample) in b.indices.iter().enumerate() {
                let len = d[sample].len();
                let row = b.row(r);
                out.insert(sample, b.actions[row.start..row.start + len].to_vec());
            }
        }
    }
    out
}

#[test]
fn per_sample_masks_do_not_depend_on_ranks_workers_or_batch_size() {
    let one = masks_by_sample(1, 1, 16, MaskSeeding::PerSample);
    let many = masks_by_sample(4, 3, 5, MaskSeeding::PerSample);
    assert_eq!(one.len(), 200);
    assert_eq!(one, many);
    // Per-worker streams do depend on who processes a sample.
    let w1 = masks_by_sample(1, 1, 16, MaskSeeding::PerWorker);
    let w3 = masks_by_sample(1, 3, 16, MaskSeeding::PerWorker);
    assert_ne!(w1, w3);
}

#[test]
fn batches_arrive_in_plan_order_whatever_the_workers() {
    let d = data(300);
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::default(), Some(masker())));
    let sampler = DistributedSampler::new(
        d.len(),
        SamplerOptions { world_size: 2, rank: 1, seed: 9, ..SamplerOptions::default() },
    )
    .unwrap();
    for workers in [1, 2, 5] {
        let cfg = LoaderConfig { batch_size: 7, workers, ..LoaderConfig::default() };
        let loader = Loader::new(Arc::clone(&d), sampler.clone(), Arc::clone(&collator), cfg).unwrap();
        let plan = loader.plan(2);
        let epoch = loader.epoch(2);
        assert_eq!(epoch.len(), plan.len());
        let got: Vec<Vec<usize>> = epoch.map(|b| b.unwrap().indices).collect();
        assert_eq!(got, plan, "{workers} workers");
        assert_eq!(got.iter().flatten().count(), 150);
    }
}

#[test]
fn per_worker_streams_differ_between_workers_and_naive_ones_do_not() {
    let d = data(64);
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::Fixed(64), Some(masker())));
    let sampler =
        DistributedSampler::new(d.len(), SamplerOptions { seed: 9, ..SamplerOptions::default() }).unwrap();
    let chosen_of = |seeding| {
        let cfg = LoaderConfig { batch_size: 8, workers: 2, seeding, ..LoaderConfig::default() };
        let loader = Loader::new(Arc::clone(&d), sampler.clone(), Arc::clone(&collator), cfg).unwrap();
        loader.epoch(0).map(|b| drove_diagnostic::RowMasks::from(&b.unwrap())).collect::<Vec<_>>()
    };
    // Batches 0 and 1 are the first batch of workers 0 and 1: compared where
    // maskable on both, naive workers agree everywhere.
    let naive = chosen_of(MaskSeeding::Naive);
    let (agree, compared) = naive[0].compare(&naive[1]);
    assert!(compared > 50, "only {compared} positions to compare");
    assert_eq!(agree, compared, "naive workers share one stream");
    let derived = chosen_of(MaskSeeding::PerWorker);
    let (agree, compared) = derived[0].compare(&derived[1]);
    assert!(agree < compared);
}

#[test]
fn dropping_an_epoch_early_stops_the_workers() {
    let d = data(2000);
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::default(), Some(masker())));
    let sampler =
        DistributedSampler::new(d.len(), SamplerOptions { seed: 9, ..SamplerOptions::default() }).unwrap();
    let cfg = LoaderConfig { batch_size: 4, workers: 3, prefetch: 1, ..LoaderConfig::default() };
    let loader = Loader::new(d, sampler, collator, cfg).unwrap();
    let mut epoch = loader.epoch(0);
    assert!(epoch.next().unwrap().is_ok());
    drop(epoch); // joins the workers; the test finishing is the assertion
    assert_eq!(loader.epoch(1).count(), 500);
}

#[test]
fn bad_loader_settings_are_refused() {
    let d = data(4);
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::default(), None));
    let sampler =
        DistributedSampler::new(d.len(), SamplerOptions { seed: 9, ..SamplerOptions::default() }).unwrap();
    let cfg = LoaderConfig { workers: 0, ..LoaderConfig::default() };
    let err = Loader::new(d, sampler, collator, cfg).unwrap_err();
    assert!(matches!(err, LoaderError::Config(_)) && err.to_string().contains("workers"), "{err}");
    assert!("sometimes".parse::<MaskSeeding>().unwrap_err().contains("naive"));
}

#[test]
fn bucketing_groups_similar_lengths_and_keeps_every_sample() {
    let d = data(512);
    let order: Vec<usize> = (0..512).collect();
    let len = |i: usize| d[i].len();
    let padded = |batches: &[Vec<usize>]| -> usize {
        batches.iter().map(|b| b.iter().map(|&i| len(i)).max().unwrap() * b.len()).sum()
    };
    let plain = make_batches(&order, len, 16, false, None, 1, 0);
    let bucketed = make_batches(&order, len, 16, false, Some(Bucketing { window_batches: 8 }), 1, 0);
    assert_eq!(plain.len(), bucketed.len());
    let mut all: Vec<usize> = bucketed.iter().flatten().copied().collect();
    all.sort_unstable();
    assert_eq!(all, order);
    assert!(padded(&bucketed) < padded(&plain) * 9 / 10, "bucketing should cut padding");
    // The batch order is shuffled identically for the same (seed, epoch).
    assert_eq!(bucketed, make_batches(&order, len, 16, false, Some(Bucketing { window_batches: 8 }), 1, 0));
    // A short last batch stays last, so batch sizes agree across ranks.
    let odd = make_batches(&order[..50], len, 16, false, Some(Bucketing { window_batches: 2 }), 1, 0);
    assert_eq!(odd.iter().map(Vec::len).collect::<Vec<_>>(), [16, 16, 16, 2]);
    let dropped = make_batches(&order[..50], len, 16, true, None, 1, 0);
    assert_eq!(dropped.len(), 3);
}

#[test]
fn a_stream_width_makes_sequential_masks_independent_of_the_padding() {
    // Two batches of different widths from identical sequential streams: with a
    // stream width every row consumes the same draws, so the patterns agree at
    // every position maskable in both, as if both were padded to that width.
    let d = data(16);
    let mut rows: Vec<&Example> = d.iter().collect();
    rows.sort_by_key(|e| e.len());
    let (short, long) = (&rows[..8], &rows[8..]);
    let masks = |rows: &[&Example], width: Option<usize>| {
        let c = Collator::new(SYNTHETIC_PAD, Padding::Longest { multiple_of: 1 }, Some(masker()));
        let c = match width {
            Some(w) => c.with_stream_width(w),
            None => c,
        };
        let mut rng = drove_seed::StreamKey::naive(42).pcg64();
        let b = c.collate(rows, &[0, 1, 2, 3, 4, 5, 6, 7], MaskSource::Sequential(&mut rng)).unwrap();
        drove_diagnostic::RowMasks::from(&b)
    };
    let (a, b) = (masks(short, Some(64)), masks(long, Some(64)));
    assert_ne!(a.width, b.width, "the fixture needs batches of different widths");
    let (agree, compared) = a.compare(&b);
    assert!(compared > 50, "only {compared} positions to compare");
    assert_eq!(agree, compared, "identical streams, identical patterns");
    // Without it, rows after the first drift apart (the draws shift by the width).
    let (agree, compared) = masks(short, None).compare(&masks(long, None));
    assert!((agree as f64) < 0.95 * compared as f64, "{agree} of {compared} agree without a stream width");
}

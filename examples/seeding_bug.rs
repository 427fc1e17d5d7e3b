//! The story in a page of Rust: 4 ranks x 4 loader workers mask 15% of tokens.
//!
//! Broken: one seed copied into every rank and every worker (`random.seed(42)`
//! before the workers fork). Every rank applies the same mask at the same step.
//! Fixed: every worker masks with a stream derived from its own key.
//!
//! `cargo run --release --example seeding_bug`
use std::sync::Arc;

use drove::collate::diag;
use drove::collate::{
    Collator, DistributedSampler, Example, Loader, LoaderConfig, MaskConfig, MaskSeeding, Masker, Padding,
    SamplerOptions,
};
use drove::diagnostic::{AgreementAccumulator, RowMasks, expected_agreement};

const WORLD: usize = 4;
const WORKERS: usize = 4;
const P: f64 = 0.15;

fn mean_agreement(data: &Arc<[Example]>, seeding: MaskSeeding) -> f64 {
    let masker = Masker::new(
        MaskConfig { probability: P, ..MaskConfig::default() },
        diag::SYNTHETIC_MASK,
        diag::SYNTHETIC_VOCAB,
    )
    .expect("valid mask settings");
    // The story's collate padded every batch to max_length = 128.
    let collator = Arc::new(Collator::new(diag::SYNTHETIC_PAD, Padding::Fixed(128), Some(masker)));
    let config = LoaderConfig {
        batch_size: 8,
        workers: WORKERS,
        seeding,
        seed: 42,
        drop_last: true,
        ..LoaderConfig::default()
    };
    // Each "rank" runs its own loader over its own shard.
    let masks: Vec<Vec<RowMasks>> = (0..WORLD)
        .map(|rank| {
            let sampler = DistributedSampler::new(
                data.len(),
                SamplerOptions { world_size: WORLD, rank, seed: 42, ..SamplerOptions::default() },
            )
            .expect("rank < world");
            let loader =
                Loader::new(Arc::clone(data), sampler, Arc::clone(&collator), config).expect("valid loader");
            loader.epoch(0).map(|batch| RowMasks::from(&batch.expect("batch"))).collect()
        })
        .collect();
    // Compare the ranks' masks step by step, where maskable on both.
    let mut acc = AgreementAccumulator::new(WORLD, P);
    for step in 0..masks[0].len() {
        let at_step: Vec<RowMasks> = masks.iter().map(|m| m[step].clone()).collect();
        acc.add_step(&at_step);
    }
    acc.report().mean_agreement
}

fn main() {
    let data: Arc<[Example]> = diag::synthetic_examples(2048, 128, 42).into();
    let broken = mean_agreement(&data, MaskSeeding::Naive);
    let fixed = mean_agreement(&data, MaskSeeding::PerSample);
    println!("cross-rank mask agreement, {WORLD} ranks x {WORKERS} workers, p = {P}");
    println!("  broken (one seed copied everywhere): {broken:.3}");
    println!("  fixed  (streams derived per sample): {fixed:.3}");
    println!("  independent masks would give p^2 + (1-p)^2 = {:.3}", expected_agreement(P));
}

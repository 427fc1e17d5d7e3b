//! Tokenize nothing, read nothing: build a small synthetic dataset, run one rank's
//! loader with two workers, and print the first batch with its masks.
//!
//! `cargo run -p drove-collate --example mask_batch`
use std::sync::Arc;

use drove_collate::diag::{SYNTHETIC_MASK, SYNTHETIC_PAD, SYNTHETIC_VOCAB, synthetic_examples};
use drove_collate::{
    Collator, DistributedSampler, Loader, LoaderConfig, MaskAction, MaskConfig, Masker, Padding,
    SamplerOptions,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = synthetic_examples(64, 24, 1).into();
    let masker = Masker::new(MaskConfig::default(), SYNTHETIC_MASK, SYNTHETIC_VOCAB)?;
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::Longest { multiple_of: 8 }, Some(masker)));
    let sampler = DistributedSampler::new(
        64,
        SamplerOptions { world_size: 2, rank: 0, seed: 42, ..SamplerOptions::default() },
    )?; // rank 0 of 2
    let config = LoaderConfig { batch_size: 4, workers: 2, ..LoaderConfig::default() };
    let loader = Loader::new(data, sampler, collator, config)?;
    println!("mask streams of epoch 0: {}", loader.stream_keys(0)[0]);
    let batch = loader.epoch(0).next().expect("an epoch has batches")?;
    for r in 0..batch.batch_size {
        let row = batch.row(r);
        let marks: String = batch.actions[row.clone()]
            .iter()
            .map(|a| match a {
                MaskAction::None => '.',
                MaskAction::Mask => 'M',
                MaskAction::Random => 'R',
                MaskAction::Keep => 'K',
            })
            .collect();
        println!("sample {:>3}: {marks}", batch.indices[r]);
    }
    Ok(())
}

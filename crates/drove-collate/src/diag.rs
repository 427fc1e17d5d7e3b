//! The diversity diagnostic on simulated ranks: every rank's loader run over a
//! synthetic dataset and its masks compared (`drove diag masks`), and a batch's
//! masks as [`RowMasks`] for [`drove_diagnostic`]'s comparison. The measurement
//! itself (agreement, its band, the verdict) is `drove-diagnostic`'s.

use std::sync::Arc;

use drove_diagnostic::{AgreementAccumulator, AgreementReport, RowMasks};
use drove_seed::StreamKey;
use rand_core::Rng;

use crate::batch::{Batch, Collator, Example, Padding};
use crate::loader::{Loader, LoaderConfig, LoaderError, MaskSeeding};
use crate::mask::{MaskConfig, MaskConfigError, Masker};
use crate::sampler::{DistributedSampler, SamplerError, SamplerOptions, below};

/// A batch's masks, as the diagnostic compares them.
impl From<&Batch> for RowMasks {
    fn from(b: &Batch) -> Self {
        RowMasks {
            width: b.seq_len,
            chosen: b.actions.iter().map(|a| a.is_chosen()).collect(),
            maskable: b.maskable.clone(),
        }
    }
}

/// Special token ids of the synthetic vocabulary (BERT-base-uncased's).
pub const SYNTHETIC_PAD: u32 = 0;
/// `[CLS]`.
pub const SYNTHETIC_CLS: u32 = 101;
/// `[SEP]`.
pub const SYNTHETIC_SEP: u32 = 102;
/// `[MASK]`.
pub const SYNTHETIC_MASK: u32 = 103;
/// Vocabulary size (BERT-base-uncased's).
pub const SYNTHETIC_VOCAB: u32 = 30_522;

/// A fixed, deterministic dataset of `n` tokenized sentences of 8 to `max_len`
/// tokens (with `[CLS]` and `[SEP]`), words of one to three subwords, and labels
/// on first subwords: enough structure to exercise masking without real data.
pub fn synthetic_examples(n: usize, max_len: usize, seed: u64) -> Vec<Example> {
    let max_len = max_len.max(8);
    let mut rng = StreamKey::init(seed).with_lane(0xda7a).pcg64();
    (0..n)
        .map(|_| {
            let len = 8 + below(&mut rng, (max_len - 8 + 1) as u64) as usize;
            let mut e = Example {
                input_ids: vec![SYNTHETIC_CLS],
                labels: vec![crate::IGNORE_LABEL],
                word_ids: vec![None],
                special: vec![true],
            };
            let mut word = 0u32;
            while e.input_ids.len() < len - 1 {
                let pieces = 1 + below(&mut rng, 3) as usize;
                let label = below(&mut rng, 9) as i64;
                for k in 0..pieces.min(len - 1 - e.input_ids.len()) {
                    e.input_ids.push(1000 + below(&mut rng, u64::from(SYNTHETIC_VOCAB - 1000)) as u32);
                    e.labels.push(if k == 0 { label } else { crate::IGNORE_LABEL });
                    e.word_ids.push(Some(word));
                    e.special.push(false);
                }
                word += 1;
            }
            e.input_ids.push(SYNTHETIC_SEP);
            e.labels.push(crate::IGNORE_LABEL);
            e.word_ids.push(None);
            e.special.push(true);
            let _ = rng.next_u32(); // keep sentences from sharing stream alignment
            e
        })
        .collect()
}

/// Settings of a simulated run for the diagnostic.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Simulation {
    /// Ranks.
    pub world_size: usize,
    /// Loader workers per rank.
    pub workers: usize,
    /// Base seed (the story's 42).
    pub seed: u64,
    /// How masks are seeded.
    pub seeding: MaskSeeding,
    /// Mask probability.
    pub probability: f64,
    /// Sentences in the synthetic dataset.
    pub samples: usize,
    /// Rows per batch per rank.
    pub batch_size: usize,
    /// Fixed padded width (the story's collate padded to `max_length`).
    pub seq_len: usize,
    /// Epoch simulated.
    pub epoch: u64,
}

impl Default for Simulation {
    fn default() -> Self {
        Simulation {
            world_size: 4,
            workers: 4,
            seed: 42,
            seeding: MaskSeeding::PerSample,
            probability: 0.15,
            samples: 2048,
            batch_size: 8,
            seq_len: 128,
            epoch: 0,
        }
    }
}

/// A simulation that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    /// Bad mask settings.
    #[error(transparent)]
    Mask(#[from] MaskConfigError),
    /// Bad world.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
    /// A loader failed.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// Fewer than two ranks: nothing to compare.
    #[error("the diagnostic compares ranks: world size must be at least 2, found {0}")]
    TooFewRanks(usize),
}

/// Runs every rank's loader (with its own workers) over the synthetic dataset for
/// one epoch and compares the ranks' masks step by step.
pub fn simulate(sim: &Simulation) -> Result<AgreementReport, SimulationError> {
    if sim.world_size < 2 {
        return Err(SimulationError::TooFewRanks(sim.world_size));
    }
    let data: Arc<[Example]> = synthetic_examples(sim.samples, sim.seq_len, sim.seed).into();
    let masker = Masker::new(
        MaskConfig { probability: sim.probability, ..MaskConfig::default() },
        SYNTHETIC_MASK,
        SYNTHETIC_VOCAB,
    )?;
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::Fixed(sim.seq_len), Some(masker)));
    let config = LoaderConfig {
        batch_size: sim.batch_size,
        workers: sim.workers,
        prefetch: 2,
        drop_last: true,
        bucketing: None,
        seeding: sim.seeding,
        seed: sim.seed,
    };
    let mut per_rank: Vec<Vec<RowMasks>> = Vec::with_capacity(sim.world_size);
    for rank in 0..sim.world_size {
        let sampler = DistributedSampler::new(
            data.len(),
            SamplerOptions { world_size: sim.world_size, rank, seed: sim.seed, ..SamplerOptions::default() },
        )?;
        let loader = Loader::new(Arc::clone(&data), sampler, Arc::clone(&collator), config)?;
        let masks =
            loader.epoch(sim.epoch).map(|b| b.map(|b| RowMasks::from(&b))).collect::<Result<_, _>>()?;
        per_rank.push(masks);
    }
    let steps = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    let mut acc = AgreementAccumulator::new(sim.world_size, sim.probability);
    for step in 0..steps {
        let masks: Vec<RowMasks> = per_rank.iter().map(|r| r[step].clone()).collect();
        acc.add_step(&masks);
    }
    Ok(acc.report())
}

//! The mask suite: masking, collation and loader throughput, in padded tokens
//! per second, with copy and RNG baselines measured in the same run so that
//! results from a noisy machine can be quoted as ratios.

use std::fmt;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drove_collate::diag::{self, SYNTHETIC_MASK, SYNTHETIC_PAD, SYNTHETIC_VOCAB};
use drove_collate::{
    Batch, Collator, DistributedSampler, Example, Loader, LoaderConfig, MaskAction, MaskConfig, MaskSeeding,
    MaskSource, Masker, Padding, SamplerOptions,
};
use drove_seed::{AugmentKey, Pcg64, Purpose, SampleStreams, StreamKey};
use rand_core::Rng;
use serde::Serialize;

use crate::error::Doing as _;
use crate::measure::spinner;
use crate::{BenchError, Machine};

/// Sentences in the dataset the collation and loader measurements cycle through.
const DATASET: usize = 4096;
/// Seed of the synthetic data and of the mask streams.
const SEED: u64 = 42;
/// Iterations every measurement makes, however short `seconds` is.
pub const MIN_ITERATIONS: u64 = 3;

/// Settings of the mask suite (`drove bench mask`).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct MaskOptions {
    /// Rows per batch.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 32, value_name = "N", value_parser = parse::batch))]
    pub batch: usize,
    /// Padded width of every row (synthetic sentences have 8 tokens or more).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 128, value_name = "N", value_parser = parse::seq))]
    pub seq: usize,
    /// Also measure the loader pool with this many worker threads.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", value_parser = parse::workers))]
    pub workers: Option<usize>,
    /// Seconds each measurement runs for (at least 3 iterations each).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2.0, value_name = "S",
        value_parser = crate::flags::seconds))]
    pub seconds: f64,
    /// Where the masker's random numbers come from.
    #[cfg_attr(feature = "clap", arg(long, default_value = "derived", value_name = "derived|per-worker|naive",
        value_parser = crate::flags::seeding))]
    pub seeding: MaskSeeding,
    /// A spinner on stderr while measuring, when stderr is a terminal (no
    /// flag; on by default).
    #[cfg_attr(feature = "clap", arg(skip = true))]
    pub progress: bool,
}

impl Default for MaskOptions {
    fn default() -> Self {
        MaskOptions {
            batch: 32,
            seq: 128,
            workers: None,
            seconds: 2.0,
            seeding: MaskSeeding::PerSample,
            progress: true,
        }
    }
}

#[cfg(feature = "clap")]
mod parse {
    use crate::flags::at_least;

    pub fn batch(s: &str) -> Result<usize, String> {
        at_least(s, 1, "batch", " row")
    }

    pub fn seq(s: &str) -> Result<usize, String> {
        at_least(s, 8, "seq", " (synthetic sentences have at least 8 tokens)")
    }

    pub fn workers(s: &str) -> Result<usize, String> {
        at_least(s, 1, "workers", " (leave --workers out to skip the loader measurement)")
    }
}

/// One measurement: `units` processed in `iterations` calls over `elapsed`.
#[derive(Clone, Copy, Debug)]
struct Rate {
    units: u64,
    iterations: u64,
    elapsed: Duration,
}

impl Rate {
    fn per_second(&self) -> f64 {
        self.units as f64 / self.elapsed.as_secs_f64()
    }
}

/// Calls `step` (which returns the units it processed) until at least `seconds`
/// have passed and at least [`MIN_ITERATIONS`] calls were made. Calls are grouped
/// in rounds that grow until a round takes about a millisecond, so reading the
/// clock does not dominate tiny steps.
fn measure(seconds: f64, mut step: impl FnMut() -> u64) -> Rate {
    let budget = Duration::from_secs_f64(seconds);
    let (mut units, mut iterations, mut reps) = (0u64, 0u64, 1u64);
    let start = Instant::now();
    loop {
        let round = Instant::now();
        for _ in 0..reps {
            units += step();
        }
        iterations += reps;
        let elapsed = start.elapsed();
        if elapsed >= budget && iterations >= MIN_ITERATIONS {
            return Rate { units, iterations, elapsed };
        }
        if round.elapsed() < Duration::from_millis(1) && reps < 1 << 20 {
            reps *= 2;
        }
    }
}

/// What the mask suite reports (the JSON of `drove bench mask --json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MaskReport {
    /// Rows per batch.
    pub batch: usize,
    /// Padded width of every row.
    pub seq: usize,
    /// Loader worker threads, if the loader was measured.
    pub workers: Option<usize>,
    /// The seeding, as its flag's word.
    pub seeding: &'static str,
    /// Seconds each measurement ran for, at least.
    pub seconds: f64,
    /// Where it ran.
    pub machine: Machine,
    /// The masker alone on one thread.
    pub masker_tokens_per_s: f64,
    /// Full collation (padding, labels, masking) on one thread.
    pub collate_tokens_per_s: f64,
    /// The loader pool, if measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loader_tokens_per_s: Option<f64>,
    /// Copying the token ids: the memory-bound floor.
    pub baseline_copy_tokens_per_s: f64,
    /// Sequential Pcg64 draws.
    pub baseline_rng_u64_per_s: f64,
    /// `masker_tokens_per_s` over the copy's.
    pub masker_vs_copy: f64,
    /// `collate_tokens_per_s` over the copy's.
    pub collate_vs_copy: f64,
    /// Iterations each measurement made.
    pub iterations: MaskIterations,
}

/// Iterations each measurement of [`MaskReport`] made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MaskIterations {
    /// The masker's.
    pub masker: u64,
    /// Collation's.
    pub collate: u64,
    /// The loader's (batches), if measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loader: Option<u64>,
    /// The copy's.
    pub baseline_copy: u64,
    /// The RNG's.
    pub baseline_rng: u64,
}

/// The masker alone on one prebuilt padded batch, copying pristine ids in first.
fn bench_masker(o: &MaskOptions, masker: &Masker) -> Result<Rate, BenchError> {
    let examples = diag::synthetic_examples(o.batch, o.seq, SEED);
    let refs: Vec<&Example> = examples.iter().collect();
    let indices: Vec<usize> = (0..o.batch).collect();
    let plain = Collator::new(SYNTHETIC_PAD, Padding::Fixed(o.seq), None)
        .collate(&refs, &indices, MaskSource::None)
        .doing("collating the masker's batch")?;
    let pristine = plain.input_ids;
    let maskable = plain.maskable;
    let width = o.seq;
    let tokens = (o.batch * width) as u64;
    let mut work = pristine.clone();
    let mut actions = vec![MaskAction::None; pristine.len()];

    let rate = match o.seeding {
        MaskSeeding::PerSample => {
            let streams = SampleStreams::new(SEED, Purpose::Augment, 0);
            let mut row_index = 0u64;
            measure(o.seconds, || {
                work.copy_from_slice(&pristine);
                for ((ids, m), a) in
                    work.chunks_mut(width).zip(maskable.chunks(width)).zip(actions.chunks_mut(width))
                {
                    let mut rng = streams.stream(row_index);
                    row_index += 1;
                    masker.mask_row(ids, m, None, a, &mut rng);
                }
                black_box(&mut work);
                black_box(&mut actions);
                tokens
            })
        }
        MaskSeeding::PerWorker | MaskSeeding::Naive => {
            let mut rng = StreamKey::augment(AugmentKey { seed: SEED, rank: 0, worker: 0, epoch: 0 }).pcg64();
            measure(o.seconds, || {
                work.copy_from_slice(&pristine);
                for ((ids, m), a) in
                    work.chunks_mut(width).zip(maskable.chunks(width)).zip(actions.chunks_mut(width))
                {
                    masker.mask_row(ids, m, None, a, &mut rng);
                }
                black_box(&mut work);
                black_box(&mut actions);
                tokens
            })
        }
    };
    Ok(rate)
}

/// Full collation (padding, labels, masking) of batches cycling through the dataset.
fn bench_collate(o: &MaskOptions, data: &[Example], masker: &Masker) -> Result<Rate, BenchError> {
    let collator = Collator::new(SYNTHETIC_PAD, Padding::Fixed(o.seq), Some(masker.clone()));
    let streams = SampleStreams::new(SEED, Purpose::Augment, 0);
    let mut rng: Pcg64 = StreamKey::augment(AugmentKey { seed: SEED, rank: 0, worker: 0, epoch: 0 }).pcg64();
    let tokens = (o.batch * o.seq) as u64;
    let mut batch = Batch::default();
    let mut refs: Vec<&Example> = Vec::with_capacity(o.batch);
    let mut indices: Vec<usize> = Vec::with_capacity(o.batch);
    let mut cursor = 0usize;
    let mut failure = None;
    let rate = measure(o.seconds, || {
        refs.clear();
        indices.clear();
        for _ in 0..o.batch {
            indices.push(cursor);
            refs.push(&data[cursor]);
            cursor = (cursor + 1) % data.len();
        }
        let source = match o.seeding {
            MaskSeeding::PerSample => MaskSource::PerSample(&streams),
            MaskSeeding::PerWorker | MaskSeeding::Naive => MaskSource::Sequential(&mut rng),
        };
        if let Err(e) = collator.collate_into(&refs, &indices, source, &mut batch) {
            failure.get_or_insert(e);
        }
        black_box(&mut batch);
        tokens
    });
    match failure {
        Some(e) => Err(e).doing("collating a benchmark batch"),
        None => Ok(rate),
    }
}

/// The loader pool with `workers` threads, epoch after epoch.
fn bench_loader(
    o: &MaskOptions,
    data: Arc<[Example]>,
    masker: &Masker,
    workers: usize,
) -> Result<Rate, BenchError> {
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::Fixed(o.seq), Some(masker.clone())));
    let sampler =
        DistributedSampler::new(data.len(), SamplerOptions { seed: SEED, ..SamplerOptions::default() })
            .doing("building the sampler")?;
    let config = LoaderConfig {
        batch_size: o.batch,
        workers,
        prefetch: 2,
        drop_last: false,
        bucketing: None,
        seeding: o.seeding,
        seed: SEED,
    };
    let loader = Loader::new(data, sampler, collator, config).doing("building the loader")?;
    let budget = Duration::from_secs_f64(o.seconds);
    let (mut units, mut iterations) = (0u64, 0u64);
    let start = Instant::now();
    for epoch in 0.. {
        for batch in loader.epoch(epoch) {
            let batch = batch.doing_with(|| format!("loader epoch {epoch}"))?;
            units += (batch.batch_size * batch.seq_len) as u64;
            iterations += 1;
            black_box(&batch);
            let elapsed = start.elapsed();
            if elapsed >= budget && iterations >= MIN_ITERATIONS {
                // The rest of the epoch is dropped (and its workers stopped) untimed.
                return Ok(Rate { units, iterations, elapsed });
            }
        }
    }
    unreachable!("the epoch loop only ends by returning")
}

/// Copying a `batch x seq` buffer of token ids: the memory-bound floor.
fn bench_copy(o: &MaskOptions) -> Rate {
    let n = o.batch * o.seq;
    let source: Vec<u32> = (0..n as u32).collect();
    let mut target = vec![0u32; n];
    measure(o.seconds, || {
        target.copy_from_slice(black_box(&source));
        black_box(&mut target);
        n as u64
    })
}

/// Sequential Pcg64 draws, `batch x seq` per iteration (one per masked position).
fn bench_rng(o: &MaskOptions) -> Rate {
    let n = (o.batch * o.seq) as u64;
    let mut rng = StreamKey::augment(AugmentKey { seed: SEED, rank: 0, worker: 0, epoch: 0 }).pcg64();
    let mut sum = 0u64;
    let rate = measure(o.seconds, || {
        for _ in 0..n {
            sum = sum.wrapping_add(rng.next_u64());
        }
        black_box(sum);
        n
    });
    black_box(sum);
    rate
}

/// Runs every measurement of the mask suite: the masker, collation, the
/// loader (with `workers`), and the copy and RNG baselines.
pub fn run(o: &MaskOptions) -> Result<MaskReport, BenchError> {
    let masker =
        Masker::new(MaskConfig::default(), SYNTHETIC_MASK, SYNTHETIC_VOCAB).doing("building the masker")?;
    let data: Arc<[Example]> = diag::synthetic_examples(DATASET, o.seq, SEED).into();
    let pb = spinner(o.progress);

    pb.set_message("masker");
    let masker_rate = bench_masker(o, &masker)?;
    tracing::debug!(?masker_rate, "masker measured");
    pb.set_message("collate");
    let collate_rate = bench_collate(o, &data, &masker)?;
    tracing::debug!(?collate_rate, "collation measured");
    let loader_rate = match o.workers {
        Some(workers) => {
            pb.set_message("loader");
            let rate = bench_loader(o, Arc::clone(&data), &masker, workers)?;
            tracing::debug!(?rate, "loader measured");
            Some(rate)
        }
        None => None,
    };
    pb.set_message("baseline: copy");
    let copy_rate = bench_copy(o);
    pb.set_message("baseline: rng");
    let rng_rate = bench_rng(o);
    pb.finish_and_clear();

    let copy = copy_rate.per_second();
    Ok(MaskReport {
        batch: o.batch,
        seq: o.seq,
        workers: o.workers,
        seeding: o.seeding.name(),
        seconds: o.seconds,
        machine: Machine::detect(),
        masker_tokens_per_s: masker_rate.per_second(),
        collate_tokens_per_s: collate_rate.per_second(),
        loader_tokens_per_s: loader_rate.map(|r| r.per_second()),
        baseline_copy_tokens_per_s: copy,
        baseline_rng_u64_per_s: rng_rate.per_second(),
        masker_vs_copy: masker_rate.per_second() / copy,
        collate_vs_copy: collate_rate.per_second() / copy,
        iterations: MaskIterations {
            masker: masker_rate.iterations,
            collate: collate_rate.iterations,
            loader: loader_rate.map(|r| r.iterations),
            baseline_copy: copy_rate.iterations,
            baseline_rng: rng_rate.iterations,
        },
    })
}

/// A rate with an SI prefix: `123.4 M`.
fn si(x: f64) -> String {
    const PREFIXES: [(f64, &str); 4] = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, prefix) in PREFIXES {
        if x >= scale {
            return format!("{:.1} {prefix}", x / scale);
        }
    }
    format!("{x:.1} ")
}

/// The report as a table: a row per measurement, with its ratio to the copy.
impl fmt::Display for MaskReport {
    fn fmt(&self, w: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self;
        writeln!(
            w,
            "drove bench mask: batch {} x seq {}, seeding {}, ~{} s per measurement",
            r.batch, r.seq, r.seeding, r.seconds
        )?;
        let nproc = r.machine.nproc.map_or_else(|| "?".to_string(), |n| n.to_string());
        let model = r.machine.cpu_model.as_deref().unwrap_or("unknown CPU");
        writeln!(w, "machine: {nproc} CPUs, {model}")?;
        writeln!(w)?;
        writeln!(w, "{:<26} {:>14} {:>11} {:>8}", "measurement", "per second", "iterations", "vs copy")?;
        let mut row = |name: &str, rate: f64, unit: &str, iterations: u64, vs_copy: Option<f64>| {
            let ratio = vs_copy.map_or_else(String::new, |x| format!("{x:.3}"));
            writeln!(w, "{name:<26} {:>14} {iterations:>11} {ratio:>8}", format!("{}{unit}", si(rate)))
        };
        let copy = r.baseline_copy_tokens_per_s;
        row("masker (1 thread)", r.masker_tokens_per_s, "tok", r.iterations.masker, Some(r.masker_vs_copy))?;
        row(
            "collate (1 thread)",
            r.collate_tokens_per_s,
            "tok",
            r.iterations.collate,
            Some(r.collate_vs_copy),
        )?;
        if let (Some(rate), Some(iterations), Some(workers)) =
            (r.loader_tokens_per_s, r.iterations.loader, r.workers)
        {
            let name = if workers == 1 {
                "loader (1 worker)".to_string()
            } else {
                format!("loader ({workers} workers)")
            };
            row(&name, rate, "tok", iterations, Some(rate / copy))?;
        }
        row("baseline: copy u32", copy, "tok", r.iterations.baseline_copy, None)?;
        row("baseline: pcg64 next_u64", r.baseline_rng_u64_per_s, "u64", r.iterations.baseline_rng, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_makes_at_least_three_iterations_even_with_no_time() {
        let mut calls = 0u64;
        let rate = measure(0.0, || {
            calls += 1;
            7
        });
        assert!(rate.iterations >= MIN_ITERATIONS);
        assert_eq!(rate.iterations, calls);
        assert_eq!(rate.units, 7 * calls);
    }

    #[test]
    fn si_prefixes() {
        assert_eq!(si(1_234_567.0), "1.2 M");
        assert_eq!(si(12.0), "12.0 ");
        assert_eq!(si(2.5e9), "2.5 G");
    }

    #[cfg(feature = "clap")]
    #[test]
    fn no_flags_are_the_default_options() {
        assert_eq!(crate::flags::parsed_from_no_flags::<MaskOptions>(), MaskOptions::default());
    }
}

//! `drove bench mask`: masking, collation and loader throughput, in padded tokens
//! per second, with copy and RNG baselines measured in the same run so that results
//! from a noisy machine can be quoted as ratios.

use std::hint::black_box;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use drove_collate::diag::{self, SYNTHETIC_MASK, SYNTHETIC_PAD, SYNTHETIC_VOCAB};
use drove_collate::{
    Batch, Collator, DistributedSampler, Example, Loader, LoaderConfig, MaskAction, MaskConfig, MaskSeeding,
    MaskSource, Masker, Padding,
};
use drove_seed::{Pcg64, Purpose, SampleStreams, StreamKey};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand_core::Rng;
use serde::Serialize;

use crate::parse;

/// Sentences in the dataset the collation and loader measurements cycle through.
const DATASET: usize = 4096;
/// Seed of the synthetic data and of the mask streams.
const SEED: u64 = 42;
/// Iterations every measurement makes, however short `--seconds` is.
const MIN_ITERATIONS: u64 = 3;

/// Settings of `drove bench mask`.
#[derive(Debug, Args)]
pub struct MaskArgs {
    /// Rows per batch.
    #[arg(long, default_value_t = 32, value_name = "N", value_parser = batch)]
    batch: usize,
    /// Padded width of every row (synthetic sentences have 8 tokens or more).
    #[arg(long, default_value_t = 128, value_name = "N", value_parser = seq)]
    seq: usize,
    /// Also measure the loader pool with this many worker threads.
    #[arg(long, value_name = "N", value_parser = workers)]
    workers: Option<usize>,
    /// Seconds each measurement runs for (at least 3 iterations each).
    #[arg(long, default_value_t = 2.0, value_name = "S", value_parser = parse::seconds)]
    seconds: f64,
    /// Where the masker's random numbers come from.
    #[arg(long, default_value = "derived", value_name = "derived|per-worker|naive", value_parser = parse::seeding)]
    seeding: MaskSeeding,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn batch(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "batch", " row")
}

fn seq(s: &str) -> Result<usize, String> {
    parse::at_least(s, 8, "seq", " (synthetic sentences have at least 8 tokens)")
}

fn workers(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "workers", " (leave --workers out to skip the loader measurement)")
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

/// What the benchmark reports.
#[derive(Debug, Serialize)]
struct Report {
    batch: usize,
    seq: usize,
    workers: Option<usize>,
    seeding: &'static str,
    seconds: f64,
    machine: Machine,
    masker_tokens_per_s: f64,
    collate_tokens_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    loader_tokens_per_s: Option<f64>,
    baseline_copy_tokens_per_s: f64,
    baseline_rng_u64_per_s: f64,
    masker_vs_copy: f64,
    collate_vs_copy: f64,
    iterations: Iterations,
}

#[derive(Debug, Serialize)]
struct Iterations {
    masker: u64,
    collate: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    loader: Option<u64>,
    baseline_copy: u64,
    baseline_rng: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Machine {
    nproc: Option<usize>,
    cpu_model: Option<String>,
}

impl Machine {
    pub(crate) fn detect() -> Self {
        let nproc = std::thread::available_parallelism().ok().map(|n| n.get());
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| {
            info.lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim() == "model name")
                .map(|(_, v)| v.trim().to_string())
        });
        Machine { nproc, cpu_model }
    }
}

/// A spinner on stderr when it is a terminal; nothing otherwise.
fn spinner() -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(None, target);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// The masker alone on one prebuilt padded batch, copying pristine ids in first.
fn bench_masker(args: &MaskArgs, masker: &Masker) -> anyhow::Result<Rate> {
    let examples = diag::synthetic_examples(args.batch, args.seq, SEED);
    let refs: Vec<&Example> = examples.iter().collect();
    let indices: Vec<usize> = (0..args.batch).collect();
    let plain = Collator::new(SYNTHETIC_PAD, Padding::Fixed(args.seq), None)
        .collate(&refs, &indices, MaskSource::None)
        .context("collating the masker's batch")?;
    let pristine = plain.input_ids;
    let maskable = plain.maskable;
    let width = args.seq;
    let tokens = (args.batch * width) as u64;
    let mut work = pristine.clone();
    let mut actions = vec![MaskAction::None; pristine.len()];

    let rate = match args.seeding {
        MaskSeeding::PerSample => {
            let streams = SampleStreams::new(SEED, Purpose::Augment, 0);
            let mut row_index = 0u64;
            measure(args.seconds, || {
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
            let mut rng = StreamKey::augment(SEED, 0, 0, 0).pcg64();
            measure(args.seconds, || {
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
fn bench_collate(args: &MaskArgs, data: &[Example], masker: &Masker) -> anyhow::Result<Rate> {
    let collator = Collator::new(SYNTHETIC_PAD, Padding::Fixed(args.seq), Some(masker.clone()));
    let streams = SampleStreams::new(SEED, Purpose::Augment, 0);
    let mut rng: Pcg64 = StreamKey::augment(SEED, 0, 0, 0).pcg64();
    let tokens = (args.batch * args.seq) as u64;
    let mut batch = Batch::default();
    let mut refs: Vec<&Example> = Vec::with_capacity(args.batch);
    let mut indices: Vec<usize> = Vec::with_capacity(args.batch);
    let mut cursor = 0usize;
    let mut failure = None;
    let rate = measure(args.seconds, || {
        refs.clear();
        indices.clear();
        for _ in 0..args.batch {
            indices.push(cursor);
            refs.push(&data[cursor]);
            cursor = (cursor + 1) % data.len();
        }
        let source = match args.seeding {
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
        Some(e) => Err(e).context("collating a benchmark batch"),
        None => Ok(rate),
    }
}

/// The loader pool with `workers` threads, epoch after epoch.
fn bench_loader(
    args: &MaskArgs,
    data: Arc<[Example]>,
    masker: &Masker,
    workers: usize,
) -> anyhow::Result<Rate> {
    let collator = Arc::new(Collator::new(SYNTHETIC_PAD, Padding::Fixed(args.seq), Some(masker.clone())));
    let sampler = DistributedSampler::new(data.len(), 1, 0, SEED).context("building the sampler")?;
    let config = LoaderConfig {
        batch_size: args.batch,
        workers,
        prefetch: 2,
        drop_last: false,
        bucketing: None,
        seeding: args.seeding,
        seed: SEED,
    };
    let loader = Loader::new(data, sampler, collator, config).context("building the loader")?;
    let budget = Duration::from_secs_f64(args.seconds);
    let (mut units, mut iterations) = (0u64, 0u64);
    let start = Instant::now();
    for epoch in 0.. {
        for batch in loader.epoch(epoch) {
            let batch = batch.with_context(|| format!("loader epoch {epoch}"))?;
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
fn bench_copy(args: &MaskArgs) -> Rate {
    let n = args.batch * args.seq;
    let source: Vec<u32> = (0..n as u32).collect();
    let mut target = vec![0u32; n];
    measure(args.seconds, || {
        target.copy_from_slice(black_box(&source));
        black_box(&mut target);
        n as u64
    })
}

/// Sequential Pcg64 draws, `batch x seq` per iteration (one per masked position).
fn bench_rng(args: &MaskArgs) -> Rate {
    let n = (args.batch * args.seq) as u64;
    let mut rng = StreamKey::augment(SEED, 0, 0, 0).pcg64();
    let mut sum = 0u64;
    let rate = measure(args.seconds, || {
        for _ in 0..n {
            sum = sum.wrapping_add(rng.next_u64());
        }
        black_box(sum);
        n
    });
    black_box(sum);
    rate
}

/// Runs every measurement and prints the result.
pub fn run(args: &MaskArgs) -> anyhow::Result<()> {
    let masker =
        Masker::new(MaskConfig::default(), SYNTHETIC_MASK, SYNTHETIC_VOCAB).context("building the masker")?;
    let data: Arc<[Example]> = diag::synthetic_examples(DATASET, args.seq, SEED).into();
    let pb = spinner();

    pb.set_message("masker");
    let masker_rate = bench_masker(args, &masker)?;
    tracing::debug!(?masker_rate, "masker measured");
    pb.set_message("collate");
    let collate_rate = bench_collate(args, &data, &masker)?;
    tracing::debug!(?collate_rate, "collation measured");
    let loader_rate = match args.workers {
        Some(workers) => {
            pb.set_message("loader");
            let rate = bench_loader(args, Arc::clone(&data), &masker, workers)?;
            tracing::debug!(?rate, "loader measured");
            Some(rate)
        }
        None => None,
    };
    pb.set_message("baseline: copy");
    let copy_rate = bench_copy(args);
    pb.set_message("baseline: rng");
    let rng_rate = bench_rng(args);
    pb.finish_and_clear();

    let copy = copy_rate.per_second();
    let report = Report {
        batch: args.batch,
        seq: args.seq,
        workers: args.workers,
        seeding: args.seeding.name(),
        seconds: args.seconds,
        machine: Machine::detect(),
        masker_tokens_per_s: masker_rate.per_second(),
        collate_tokens_per_s: collate_rate.per_second(),
        loader_tokens_per_s: loader_rate.map(|r| r.per_second()),
        baseline_copy_tokens_per_s: copy,
        baseline_rng_u64_per_s: rng_rate.per_second(),
        masker_vs_copy: masker_rate.per_second() / copy,
        collate_vs_copy: collate_rate.per_second() / copy,
        iterations: Iterations {
            masker: masker_rate.iterations,
            collate: collate_rate.iterations,
            loader: loader_rate.map(|r| r.iterations),
            baseline_copy: copy_rate.iterations,
            baseline_rng: rng_rate.iterations,
        },
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
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

fn table(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let w = &mut out;
    // Writing to a String cannot fail.
    let _ = writeln!(
        w,
        "drove bench mask: batch {} x seq {}, seeding {}, ~{} s per measurement",
        r.batch, r.seq, r.seeding, r.seconds
    );
    let nproc = r.machine.nproc.map_or_else(|| "?".to_string(), |n| n.to_string());
    let model = r.machine.cpu_model.as_deref().unwrap_or("unknown CPU");
    let _ = writeln!(w, "machine: {nproc} CPUs, {model}");
    let _ = writeln!(w);
    let _ = writeln!(w, "{:<26} {:>14} {:>11} {:>8}", "measurement", "per second", "iterations", "vs copy");
    let mut row = |name: &str, rate: f64, unit: &str, iterations: u64, vs_copy: Option<f64>| {
        let ratio = vs_copy.map_or_else(String::new, |x| format!("{x:.3}"));
        let _ = writeln!(w, "{name:<26} {:>14} {iterations:>11} {ratio:>8}", format!("{}{unit}", si(rate)));
    };
    let copy = r.baseline_copy_tokens_per_s;
    row("masker (1 thread)", r.masker_tokens_per_s, "tok", r.iterations.masker, Some(r.masker_vs_copy));
    row("collate (1 thread)", r.collate_tokens_per_s, "tok", r.iterations.collate, Some(r.collate_vs_copy));
    if let (Some(rate), Some(iterations), Some(workers)) =
        (r.loader_tokens_per_s, r.iterations.loader, r.workers)
    {
        let name = if workers == 1 {
            "loader (1 worker)".to_string()
        } else {
            format!("loader ({workers} workers)")
        };
        row(&name, rate, "tok", iterations, Some(rate / copy));
    }
    row("baseline: copy u32", copy, "tok", r.iterations.baseline_copy, None);
    row("baseline: pcg64 next_u64", r.baseline_rng_u64_per_s, "u64", r.iterations.baseline_rng, None);
    out
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
}

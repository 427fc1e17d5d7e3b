//! `drove seed`: print a stream key, its derived seed and its first outputs, or
//! replay a logged derived seed.

use std::fmt::Write as _;

use anyhow::bail;
use clap::{Args, ValueEnum};
use drove_seed::rand_core::Rng;
use drove_seed::{AugmentKey, DerivedSeed, DropoutKey, Purpose, SampleStreams, ShuffleKey, StreamKey};
use serde::Serialize;

/// Settings of `drove seed`.
#[derive(Debug, Args)]
pub struct SeedArgs {
    /// The stream family (naive: the one stream the bug copies everywhere).
    #[arg(long, value_enum, required_unless_present = "replay")]
    purpose: Option<PurposeArg>,
    /// Base seed.
    #[arg(long, required_unless_present = "replay")]
    seed: Option<u64>,
    /// Rank (augment and dropout keys).
    #[arg(long)]
    rank: Option<u32>,
    /// Loader worker (augment keys).
    #[arg(long)]
    worker: Option<u32>,
    /// Epoch (shuffle and augment keys; per-sample streams).
    #[arg(long)]
    epoch: Option<u64>,
    /// Optimizer step (dropout keys: a rank draws new masks each step).
    #[arg(long)]
    step: Option<u64>,
    /// Lane: an independent sub-stream of the same key.
    #[arg(long)]
    lane: Option<u32>,
    /// Global sample index: print the per-sample stream of this sample (ChaCha8).
    #[arg(long)]
    sample: Option<u64>,
    /// Replay a derived seed (64 hex digits, as printed): its Pcg64 outputs.
    #[arg(
        long,
        value_name = "HEX64",
        conflicts_with_all = ["purpose", "seed", "rank", "worker", "epoch", "lane", "sample"]
    )]
    replay: Option<DerivedSeed>,
    /// How many u64 outputs to print.
    #[arg(long, default_value_t = 4, value_name = "K")]
    count: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Stream families on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PurposeArg {
    /// Sampler order: the same on every rank (seed, epoch).
    Shuffle,
    /// Augmentation: distinct per rank, worker and epoch.
    Augment,
    /// Weight initialisation: the same on every rank (seed).
    Init,
    /// Dropout: distinct per rank and epoch.
    Dropout,
    /// The bug: one stream for every rank, worker and epoch (seed).
    Naive,
}

impl PurposeArg {
    fn purpose(self) -> Option<Purpose> {
        match self {
            PurposeArg::Shuffle => Some(Purpose::Shuffle),
            PurposeArg::Augment => Some(Purpose::Augment),
            PurposeArg::Init => Some(Purpose::Init),
            PurposeArg::Dropout => Some(Purpose::Dropout),
            PurposeArg::Naive => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            PurposeArg::Shuffle => "shuffle",
            PurposeArg::Augment => "augment",
            PurposeArg::Init => "init",
            PurposeArg::Dropout => "dropout",
            PurposeArg::Naive => "naive",
        }
    }
}

/// What `drove seed` prints.
#[derive(Debug, PartialEq, Eq, Serialize)]
struct SeedReport {
    /// The key (`Display`), absent when replaying a bare derived seed.
    key: Option<String>,
    /// The derived seed, 64 hex digits.
    derived_seed: String,
    /// Global sample index of a per-sample stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    sample: Option<u64>,
    /// The generator the outputs come from.
    generator: &'static str,
    /// First outputs, `0x%016x`.
    outputs: Vec<String>,
}

fn first_outputs<R: Rng>(rng: &mut R, count: usize) -> Vec<String> {
    (0..count).map(|_| format!("{:#018x}", rng.next_u64())).collect()
}

/// Fails if an id the key does not contain was given: it would be silently ignored.
fn reject(given: &[(&str, bool)], what: &str, why: &str) -> anyhow::Result<()> {
    let extra: Vec<String> = given.iter().filter(|(_, g)| *g).map(|(n, _)| format!("--{n}")).collect();
    if !extra.is_empty() {
        bail!("{} not part of {what} ({why})", describe(&extra));
    }
    Ok(())
}

fn describe(flags: &[String]) -> String {
    match flags {
        [one] => format!("{one} is"),
        many => format!("{} are", many.join(", ")),
    }
}

impl SeedArgs {
    fn report(&self) -> anyhow::Result<SeedReport> {
        if let Some(derived) = self.replay {
            return Ok(SeedReport {
                key: None,
                derived_seed: derived.to_string(),
                sample: None,
                generator: "pcg64",
                outputs: first_outputs(&mut derived.pcg64(), self.count),
            });
        }
        let (Some(purpose), Some(seed)) = (self.purpose, self.seed) else {
            bail!("give --purpose and --seed, or --replay HEX64");
        };
        let (rank, worker, epoch, lane) =
            (self.rank.is_some(), self.worker.is_some(), self.epoch.is_some(), self.lane.is_some());
        if self.step.is_some() && purpose != PurposeArg::Dropout {
            bail!("--step is part of a dropout key only (the others count epochs: --epoch)");
        }
        if let Some(sample) = self.sample {
            let Some(p) = purpose.purpose() else {
                bail!("--sample needs a real purpose: the naive stream has no per-sample family");
            };
            reject(
                &[("rank", rank), ("worker", worker), ("lane", lane)],
                "a per-sample stream",
                "it depends only on seed, purpose, epoch and sample, so masks do not change when a run is re-sharded",
            )?;
            let streams = SampleStreams::new(seed, p, self.epoch.unwrap_or(0));
            return Ok(SeedReport {
                key: Some(streams.key().to_string()),
                derived_seed: streams.derived().to_string(),
                sample: Some(sample),
                generator: "chacha8",
                outputs: first_outputs(&mut streams.stream(sample), self.count),
            });
        }
        let (r, w, e) = (self.rank.unwrap_or(0), self.worker.unwrap_or(0), self.epoch.unwrap_or(0));
        let key = match purpose {
            PurposeArg::Shuffle => {
                reject(
                    &[("rank", rank), ("worker", worker)],
                    "a shuffle key",
                    "the sampler order must be the same on every rank and worker",
                )?;
                StreamKey::shuffle(ShuffleKey { seed, epoch: e })
            }
            PurposeArg::Augment => StreamKey::augment(AugmentKey { seed, rank: r, worker: w, epoch: e }),
            PurposeArg::Init => {
                reject(
                    &[("rank", rank), ("worker", worker), ("epoch", epoch)],
                    "an init key",
                    "initial weights must be the same on every rank",
                )?;
                StreamKey::init(seed)
            }
            PurposeArg::Dropout => {
                let why = "dropout streams are per rank and step (--step)";
                reject(&[("worker", worker), ("epoch", epoch)], "a dropout key", why)?;
                StreamKey::dropout(DropoutKey { seed, rank: r, step: self.step.unwrap_or(0) })
            }
            PurposeArg::Naive => {
                reject(
                    &[("rank", rank), ("worker", worker), ("epoch", epoch)],
                    "the naive key",
                    "the bug is exactly that one stream serves every rank, worker and epoch",
                )?;
                StreamKey::naive(seed)
            }
        };
        let key = key.with_lane(self.lane.unwrap_or(0));
        tracing::debug!(purpose = purpose.name(), %key, "deriving");
        let derived = key.derive();
        Ok(SeedReport {
            key: Some(key.to_string()),
            derived_seed: derived.to_string(),
            sample: None,
            generator: "pcg64",
            outputs: first_outputs(&mut derived.pcg64(), self.count),
        })
    }
}

fn human(report: &SeedReport) -> String {
    let mut out = String::new();
    let w = &mut out;
    // Writing to a String cannot fail.
    if let Some(key) = &report.key {
        let label = if report.sample.is_some() { "family key" } else { "key" };
        let _ = writeln!(w, "{label:<13}{key}");
    }
    let _ = writeln!(w, "{:<13}{}", "derived seed", report.derived_seed);
    if let Some(sample) = report.sample {
        let _ = writeln!(w, "{:<13}{sample}", "sample");
    }
    let _ = writeln!(w, "first {} outputs ({}, u64):", report.outputs.len(), report.generator);
    for o in &report.outputs {
        let _ = writeln!(w, "  {o}");
    }
    out
}

/// Prints the key, derived seed and outputs.
pub fn run(args: &SeedArgs) -> anyhow::Result<()> {
    let report = args.report()?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", human(&report));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: SeedArgs,
    }

    fn report(argv: &[&str]) -> anyhow::Result<SeedReport> {
        let mut full = vec!["seed"];
        full.extend_from_slice(argv);
        Wrapper::try_parse_from(full)?.args.report()
    }

    #[test]
    fn ids_outside_the_key_are_rejected_by_name() {
        let err = report(&["--purpose", "shuffle", "--seed", "1", "--rank", "2"]).unwrap_err().to_string();
        assert!(err.contains("--rank is not part of a shuffle key"), "{err}");
        let err =
            report(&["--purpose", "naive", "--seed", "1", "--worker", "2", "--epoch", "1"]).unwrap_err();
        assert!(err.to_string().contains("--worker, --epoch are not part of the naive key"), "{err}");
        let err =
            report(&["--purpose", "augment", "--seed", "1", "--sample", "3", "--rank", "1"]).unwrap_err();
        assert!(err.to_string().contains("per-sample stream"), "{err}");
    }

    #[test]
    fn replay_reproduces_a_derived_key() {
        let keyed = report(&["--purpose", "dropout", "--seed", "7", "--rank", "3", "--step", "2"]).unwrap();
        let replayed = report(&["--replay", &keyed.derived_seed]).unwrap();
        assert_eq!(replayed.outputs, keyed.outputs);
        assert_eq!(replayed.outputs.len(), 4);
    }

    #[test]
    fn per_sample_stream_prints_its_family() {
        let r = report(&["--purpose", "augment", "--seed", "42", "--sample", "17", "--count", "2"]).unwrap();
        assert!(r.key.as_deref().unwrap().contains("per-sample"), "{r:?}");
        assert_eq!(r.sample, Some(17));
        assert_eq!(r.generator, "chacha8");
        let text = human(&r);
        assert!(text.starts_with("family key"), "{text}");
    }
}

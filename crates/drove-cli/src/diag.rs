//! `drove diag masks`: cross-rank mask agreement of a simulated run.

use std::fmt::Write as _;

use anyhow::{Context, ensure};
use clap::Args;
use drove_collate::MaskSeeding;
use drove_collate::diag::{self, Simulation};
use drove_diagnostic::AgreementReport;

use crate::parse;

/// Settings of `drove diag masks`.
#[derive(Debug, Args)]
pub struct MasksArgs {
    /// Ranks in the simulated run (at least 2: the diagnostic compares ranks).
    #[arg(long, default_value_t = 4, value_name = "N", value_parser = world_size)]
    world_size: usize,
    /// Loader workers per rank.
    #[arg(long, default_value_t = 4, value_name = "N", value_parser = workers)]
    workers: usize,
    /// Base seed, as given to every process.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// How masks are seeded: derived (per-sample streams, the default), per-worker
    /// (one stream per rank x worker x epoch) or naive (one stream copied to every
    /// rank and worker: the bug).
    #[arg(long, default_value = "derived", value_name = "derived|per-worker|naive", value_parser = parse::seeding)]
    seeding: MaskSeeding,
    /// Probability that a maskable token is chosen.
    #[arg(long, default_value_t = 0.15, value_name = "P", value_parser = parse::probability)]
    probability: f64,
    /// Sentences in the synthetic dataset.
    #[arg(long, default_value_t = 2048, value_name = "N", value_parser = positive_samples)]
    samples: usize,
    /// Rows per batch on each rank.
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = batch_size)]
    batch_size: usize,
    /// Fixed padded width of every batch (synthetic sentences have 8 tokens or more).
    #[arg(long, default_value_t = 128, value_name = "N", value_parser = seq_len)]
    seq_len: usize,
    /// Epoch simulated.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Print one JSON object instead of the readable report.
    #[arg(long)]
    json: bool,
}

fn world_size(s: &str) -> Result<usize, String> {
    parse::at_least(s, 2, "world size", " (the diagnostic compares ranks)")
}

fn workers(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "workers", " per rank")
}

fn positive_samples(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "samples", "")
}

fn batch_size(s: &str) -> Result<usize, String> {
    parse::at_least(s, 1, "batch size", "")
}

fn seq_len(s: &str) -> Result<usize, String> {
    parse::at_least(s, 8, "seq len", " (synthetic sentences have at least 8 tokens)")
}

impl MasksArgs {
    fn simulation(&self) -> anyhow::Result<Simulation> {
        let shard = self.samples.div_ceil(self.world_size);
        ensure!(
            shard >= self.batch_size,
            "too few samples: {} samples over {} ranks give each rank {shard}, less than one batch of {}; \
             raise --samples or lower --batch-size",
            self.samples,
            self.world_size,
            self.batch_size
        );
        Ok(Simulation {
            world_size: self.world_size,
            workers: self.workers,
            seed: self.seed,
            seeding: self.seeding,
            probability: self.probability,
            samples: self.samples,
            batch_size: self.batch_size,
            seq_len: self.seq_len,
            epoch: self.epoch,
        })
    }
}

/// Runs the simulation and prints the report.
pub fn run(args: &MasksArgs) -> anyhow::Result<()> {
    let sim = args.simulation()?;
    tracing::info!(?sim, "simulating a run to measure mask agreement");
    let report = diag::simulate(&sim).context("the simulated run failed")?;
    tracing::debug!(steps = report.steps, mean = report.mean_agreement, "simulation done");
    if args.json {
        println!("{}", serde_json::to_string(&json_report(&sim, &report)?)?);
    } else {
        print!("{}", human_report(&sim, &report));
    }
    Ok(())
}

/// The report as one JSON object, with the settings under `"simulation"`.
fn json_report(sim: &Simulation, report: &AgreementReport) -> anyhow::Result<serde_json::Value> {
    let mut value = serde_json::to_value(report).context("serialising the agreement report")?;
    let mut settings = serde_json::to_value(sim).context("serialising the simulation settings")?;
    // The command-line name of the seeding, as given to `--seeding`.
    settings["seeding"] = sim.seeding.name().into();
    value["simulation"] = settings;
    Ok(value)
}

fn human_report(sim: &Simulation, report: &AgreementReport) -> String {
    let mut out = String::new();
    let w = &mut out;
    // Writing to a String cannot fail.
    let _ = writeln!(w, "drove diag masks: cross-rank mask agreement of a simulated run");
    let _ = writeln!(
        w,
        "  world size {}, {} loader workers per rank, seed {}, seeding {}",
        sim.world_size, sim.workers, sim.seed, sim.seeding
    );
    let _ = writeln!(
        w,
        "  mask probability {}, {} samples, batch size {}, seq len {}, epoch {}, {} steps compared",
        sim.probability, sim.samples, sim.batch_size, sim.seq_len, sim.epoch, report.steps
    );
    let _ = writeln!(w);
    let _ = writeln!(w, "agreement matrix (rank x rank):");
    let _ = write!(w, "        ");
    for b in 0..report.world_size {
        let _ = write!(w, " {:>7}", format!("rank {b}"));
    }
    let _ = writeln!(w);
    for (a, row) in report.matrix.iter().enumerate() {
        let _ = write!(w, "  {:<6}", format!("rank {a}"));
        for x in row {
            let _ = write!(w, " {x:>7.3}");
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w);
    let band = 3.0 * report.sigma;
    let _ = writeln!(w, "mean agreement          {:.6}", report.mean_agreement);
    let _ = writeln!(w, "expected p^2+(1-p)^2    {:.6}", report.expected);
    let _ = writeln!(
        w,
        "sigma                   {:.6}  (3-sigma band {:.6} .. {:.6})",
        report.sigma,
        report.expected - band,
        report.expected + band
    );
    let _ = writeln!(w, "normalised score        {:.3}  (0 independent, 1 identical)", report.normalised);
    let _ = writeln!(w, "verdict                 {}", report.verdict);
    let _ = writeln!(w);
    // What the verdict means: the same words as the training alarm's.
    let _ = writeln!(w, "{}", report.explain());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use drove_diagnostic::{AgreementAccumulator, RowMasks};

    fn report(mean_agrees: bool) -> AgreementReport {
        // Two ranks, one row of 4 maskable positions, over many steps.
        let mut acc = AgreementAccumulator::new(2, 0.5);
        let a = RowMasks { width: 4, chosen: vec![true, false, true, false], maskable: vec![true; 4] };
        let b = if mean_agrees {
            a.clone()
        } else {
            RowMasks { width: 4, chosen: vec![true, true, false, false], maskable: vec![true; 4] }
        };
        for _ in 0..200 {
            acc.add_step(&[a.clone(), b.clone()]);
        }
        acc.report()
    }

    #[test]
    fn human_report_names_the_verdict_and_explains_it() {
        let sim = Simulation { world_size: 2, probability: 0.5, ..Simulation::default() };
        let identical = human_report(&sim, &report(true));
        assert!(identical.contains("verdict                 identical"), "{identical}");
        assert!(identical.contains("Every rank and worker drew the same random stream"), "{identical}");
        let diverse = human_report(&sim, &report(false));
        assert!(diverse.contains("verdict                 diverse"), "{diverse}");
        assert!(diverse.contains("Each rank masks independently"), "{diverse}");
    }

    #[test]
    fn json_report_uses_the_command_line_seeding_name() {
        let sim = Simulation { seeding: MaskSeeding::PerWorker, ..Simulation::default() };
        let v = json_report(&sim, &report(true)).unwrap();
        assert_eq!(v["simulation"]["seeding"], "per-worker");
        assert_eq!(v["verdict"], "identical");
    }

    #[test]
    fn too_few_samples_for_one_batch_is_an_error() {
        let args = MasksArgs {
            world_size: 4,
            workers: 1,
            seed: 1,
            seeding: MaskSeeding::Naive,
            probability: 0.15,
            samples: 10,
            batch_size: 8,
            seq_len: 16,
            epoch: 0,
            json: false,
        };
        let err = args.simulation().unwrap_err().to_string();
        assert!(err.contains("too few samples"), "{err}");
    }
}

//! Train your own burn model with drove: a small MLP fitted to a synthetic
//! regression set, data-parallel under `drove run`, through `drove_train::Replica`.
//!
//! ```text
//! cargo build --release -p drove-cli --bin drove --example own_model
//! target/release/drove run --np 2 -- target/release/examples/own_model
//! ```
//!
//! Alone (no launcher) it trains as a world of one. Every step's global batch
//! is `--rows` x ranks x `--passes` samples; each rank takes its own rows.
//!
//! `drove_launch::Launched` gives it what `drove train ner` has under
//! `drove run`: the communicator, the loss recorded on the coordinator (so
//! `drove runs` lists the run and `drove report` draws it), rank 0's progress
//! on the launcher's bar, and, with `--checkpoint DIR`, a resume from the
//! latest checkpoint when `drove run --max-restarts N` restarts the world.
use std::path::PathBuf;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::{Tensor, TensorData, backend::Backend};
use clap::Parser;
use drove_launch::{Launched, Progress, RankOutcome, Start};
use drove_seed::rand_core::Rng;
use drove_seed::{Purpose, SampleStreams, StreamKey};
use drove_train::{Placement, Replica, ReplicaOptions, checkpoint};

type B = Autodiff<Flex>;
const FEATURES: usize = 8;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Linear<B>,
    /// Hidden layers after the first (`--depth` - 1).
    deeper: Vec<Linear<B>>,
    relu: Relu,
    out: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self
            .deeper
            .iter()
            .fold(self.relu.forward(self.hidden.forward(x)), |x, layer| self.relu.forward(layer.forward(x)));
        self.out.forward(x)
    }
}

/// Sample `i`: features in [-1, 1) from the sample's own stream (the same on
/// every rank), and a target that is a fixed function of them.
fn sample(i: usize) -> ([f32; FEATURES], f32) {
    let mut rng = SampleStreams::new(7, Purpose::Init, 0).stream(i as u64);
    let x: [f32; FEATURES] = std::array::from_fn(|_| (rng.next_u64() >> 40) as f32 / (1 << 23) as f32 - 1.0);
    let y = x.iter().enumerate().map(|(k, v)| (k as f32 + 1.0).sin() * v).sum::<f32>() + x[0] * x[1];
    (x, y)
}

/// Options.
#[derive(Parser)]
struct Args {
    /// Optimizer steps.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Rows per rank and backward pass.
    #[arg(long, default_value_t = 32)]
    rows: usize,
    /// Backward passes per step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    passes: usize,
    /// Learning rate for one rank (scaled linearly with the ranks).
    #[arg(long, default_value_t = 1e-2)]
    lr: f64,
    /// host or backend.
    #[arg(long, default_value = "host")]
    placement: Placement,
    /// Hidden layers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    depth: u32,
    /// All-reduce after backward instead of overlapping it with backward.
    #[arg(long)]
    no_overlap: bool,
    /// Write the final checkpoint under this folder.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Checkpoint every --checkpoint-every steps under this folder, and resume
    /// from its latest when the launcher restarts the world.
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = 10)]
    checkpoint_every: u64,
    /// Make rank --rank-to-fail kill itself with SIGKILL after step N, in the
    /// first attempt only (a test of restarts).
    #[arg(long, value_name = "N")]
    fail_at_step: Option<u64>,
    /// The rank --fail-at-step kills.
    #[arg(long, default_value_t = 0)]
    rank_to_fail: usize,
    /// Write each applied step's global loss and gradient norm before
    /// clipping to this file (rank 0), one JSON line a step: what shows a
    /// gradient's scale, which the parameters after AdamW do not.
    #[arg(long, value_name = "FILE")]
    scales: Option<PathBuf>,
}

/// Where the loop stands, saved with each checkpoint.
#[derive(serde::Serialize)]
struct LoopPosition {
    steps: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Under `drove run` the ranks find each other through its coordinator;
    // alone, a world of one without metrics.
    let launched = Launched::join()?;
    let rank = launched.rank();
    let trained = train(&args, &launched);
    // Every rank ends the same way, failed or not: its last metrics
    // delivered, and (rank 0) its coordinator up until all have left.
    let error = trained.as_ref().err().map(|e| format!("{e:#}"));
    let outcome = match &error {
        None => RankOutcome::Finished { steps: args.steps as u64 },
        Some(error) => RankOutcome::Failed { steps: 0, error },
    };
    if let Some(delivery) = launched.finish(outcome)
        && delivery.undelivered() > 0
    {
        eprintln!("warning: rank {rank}: {delivery}");
    }
    trained
}

/// Trains on the launched ranks.
fn train(args: &Args, launched: &Launched) -> anyhow::Result<()> {
    let (rank, world, device) = (launched.rank(), launched.world_size(), Default::default());
    B::seed(&device, StreamKey::init(42).derive().words()[0]); // the same initial weights everywhere
    let model = Mlp::<B> {
        hidden: LinearConfig::new(FEATURES, 32).init(&device),
        deeper: (1..args.depth).map(|_| LinearConfig::new(32, 32).init(&device)).collect(),
        relu: Relu::new(),
        out: LinearConfig::new(32, 1).init(&device),
    };
    let options = ReplicaOptions {
        lr: args.lr,
        backward_passes_per_step: args.passes,
        placement: args.placement,
        overlap: !args.no_overlap,
        ..ReplicaOptions::default()
    };
    // Starts every rank from rank 0's parameters.
    let mut replica = Replica::new(model, launched.comm(), options, &device)?;
    if let Some(root) = &args.checkpoint
        && launched.start(&root.join("latest")) == Start::Resume
        && let Some(dir) = checkpoint::latest(root)?
    {
        replica.load(&dir)?;
        if rank == 0 {
            println!("resumed from {} at step {}", dir.display(), replica.steps());
        }
    }
    let total = args.steps as u64;
    let mut loss = f64::NAN;
    let mut scales = String::new();
    while replica.steps() < total {
        let step = replica.steps() as usize;
        for pass in 0..args.passes {
            let first = ((step * args.passes + pass) * world + rank) * args.rows;
            let batch: Vec<_> = (first..first + args.rows).map(sample).collect();
            let outcome = replica.step(&batch, |model, micro| {
                let rows = &batch[micro.rows.clone()];
                let x: Vec<f32> = rows.iter().flat_map(|(x, _)| *x).collect();
                let y: Vec<f32> = rows.iter().map(|(_, y)| *y).collect();
                let x = Tensor::from_data(TensorData::new(x, [rows.len(), FEATURES]), &device);
                let y = Tensor::from_data(TensorData::new(y, [rows.len(), 1]), &device);
                MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
            })?;
            loss = outcome.global_loss.unwrap_or(loss);
            if let (true, Some(norm)) = (outcome.applied, outcome.grad_norm) {
                let line =
                    serde_json::json!({ "step": outcome.step, "global_loss": loss, "grad_norm": norm });
                scales.push_str(&format!("{line}\n"));
            }
        }
        let done = replica.steps();
        launched.record(done, drove_launch::metric_names::LOSS, loss);
        let shown = launched.progress(&Progress { loss: Some(loss), ..Progress::at(done, total) });
        if rank == 0 && !shown && step.is_multiple_of(50) {
            println!("step {step}: loss {loss:.5}");
        }
        if let Some(root) = &args.checkpoint
            && done.is_multiple_of(args.checkpoint_every.max(1))
        {
            // The metrics up to a checkpoint are delivered before it is written:
            // a restart redoes the steps after it, and loses no point before.
            launched.flush(std::time::Duration::from_secs(30))?;
            replica.save(root, &LoopPosition { steps: done }, &[], 2)?;
        }
        if args.fail_at_step == Some(done) && rank == args.rank_to_fail && !launched.env().restarted() {
            eprintln!("rank {rank}: killing itself with SIGKILL after step {done} (--fail-at-step)");
            launched.flush(std::time::Duration::from_secs(30))?;
            // SAFETY: kill(2) on this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    }
    if rank == 0 {
        println!("final loss {loss:.5} after {} steps on {world} rank(s)", args.steps);
        let (overlapped, hooked) = replica.overlapping();
        println!("all-reduce overlapped with backward: {overlapped} ({hooked} parameters hooked)");
    }
    if let Some(dir) = &args.save {
        replica.save(dir, &LoopPosition { steps: total }, &[], 1)?;
    }
    if let (0, Some(path)) = (rank, &args.scales) {
        std::fs::write(path, scales).map_err(|e| anyhow::anyhow!("--scales {}: {e}", path.display()))?;
    }
    Ok(())
}

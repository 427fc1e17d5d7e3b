//! `drove train ner`: fine-tunes a BERT for NER on CoNLL-format data, alone or as
//! one rank under `drove run --np N`; and `drove bench train`, its throughput.
//!
//! Under a launcher the ranks join through `Communicator::from_env` and stream
//! their metrics to the coordinator (`DROVE_COORDINATOR`); alone, the run is a
//! world of one. Rank 0 shows progress (a bar on a terminal, a line every
//! `--log-every` steps otherwise), writes checkpoints and predictions under
//! `--out`, and prints the summary.

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, anyhow};
use burn::backend::{Autodiff, Flex};
use clap::Args;
use drove_collate::MaskSeeding;
use drove_comm::{Collective, Communicator, SingleProcess};
use drove_metrics::{MetricsRecorder, RecorderOptions, metric_names};
use drove_ner::{
    DiagnoseReport, EvalReport, MaskAlarm, NerError, NerOptions, NerSummary, Observer, StepReport, train_ner,
};
use drove_train::Placement;
use drove_train::flat::AdamWSettings;
use drove_train::gpu::DeviceChoice;
use drove_train::schedule::LrScaling;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::process::ExitCode;

use crate::{gpu, parse};

type Backend = Autodiff<Flex>;

/// Settings of `drove train ner`.
#[derive(Debug, Args)]
pub struct NerArgs {
    /// Folder with train.txt, valid.txt and test.txt (CoNLL-2003 format).
    #[arg(long, value_name = "DIR", default_value = "assets/conll2003")]
    data: PathBuf,
    /// Folder with config.json, model.safetensors and vocab.txt (HuggingFace layout).
    #[arg(long, value_name = "DIR", default_value = "assets/minilm")]
    model: PathBuf,
    /// Output folder: checkpoints (with predictions beside them) and summary.json.
    #[arg(long, value_name = "DIR", default_value = "runs/ner")]
    out: PathBuf,
    /// Epochs.
    #[arg(long, default_value_t = 3, value_parser = |s: &str| parse::at_least(s, 1, "--epochs", ""))]
    epochs: usize,
    /// Sentences per batch on each rank.
    #[arg(long, value_name = "PER_RANK", default_value_t = 32,
          value_parser = |s: &str| parse::at_least(s, 1, "--batch-size", ""))]
    batch_size: usize,
    /// Peak learning rate for one rank (scaled by --lr-scaling with the world size).
    #[arg(long, default_value_t = 5e-5, allow_negative_numbers = true,
          value_parser = |s: &str| parse::finite_at_least(s, 0.0, "--lr"))]
    lr: f64,
    /// How the learning rate grows with the world size: none, linear (Horovod) or sqrt.
    #[arg(long, default_value = "linear")]
    lr_scaling: LrScaling,
    /// Fraction of the steps spent warming the learning rate up.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true,
          value_parser = |s: &str| parse::fraction(s, "--warmup"))]
    warmup: f64,
    /// AdamW weight decay (not applied to biases and LayerNorm weights).
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true,
          value_parser = |s: &str| parse::finite_at_least(s, 0.0, "--weight-decay"))]
    weight_decay: f64,
    /// Clip the gradients' global norm to this (0: no clipping).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true,
          value_parser = |s: &str| parse::finite_at_least(s, 0.0, "--clip-norm"))]
    clip_norm: f64,
    /// Truncate sentences to this many tokens.
    #[arg(long, default_value_t = 128, value_parser = |s: &str| parse::at_least(s, 3, "--max-len", ""))]
    max_len: usize,
    /// Keep the case of words (for cased models; MiniLM is uncased).
    #[arg(long)]
    cased: bool,
    /// Mask each token with this probability as augmentation (0: none).
    #[arg(long, value_name = "P", default_value_t = 0.0, allow_negative_numbers = true,
          value_parser = |s: &str| parse::fraction(s, "--augment-mask"))]
    augment_mask: f64,
    /// How masks are seeded: derived (per sample, the default), per-worker, or
    /// naive (the bug: every rank and worker the same stream).
    #[arg(long, default_value = "derived", value_parser = parse::seeding)]
    seeding: MaskSeeding,
    /// Base seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Every N steps, compare the ranks' masks and local gradients (0: never)
    /// [default: 50 with --augment-mask above 0 on more than one rank, else 0].
    #[arg(long, value_name = "N")]
    diagnose_every: Option<usize>,
    /// Write a Horovod-style timeline of every rank's steps to FILE (Chrome
    /// trace-event JSON: open it in Perfetto or chrome://tracing) [env: DROVE_TIMELINE].
    #[arg(long, value_name = "FILE")]
    timeline: Option<PathBuf>,
    /// What the diversity alarm does when a diagnosed step's masks are identical
    /// across ranks: warn once, or fail the run at that step (exit code 3).
    #[arg(long, value_name = "warn|fail", default_value = "warn")]
    on_identical_masks: MaskAlarm,
    /// The parameter whose local gradients --diagnose-every compares.
    #[arg(long, value_name = "NAME", default_value = "bert.layers.last.query.weight")]
    diagnose_parameter: String,
    /// Train on the first N sentences only.
    #[arg(long, value_name = "N")]
    max_train_sentences: Option<usize>,
    /// Evaluate on the first N sentences of each set only.
    #[arg(long, value_name = "N")]
    max_eval_sentences: Option<usize>,
    /// Sets to evaluate after every epoch (comma-separated; empty for none).
    #[arg(long, value_name = "SETS", default_value = "valid,test", value_delimiter = ',')]
    eval: Vec<String>,
    /// Also checkpoint every N steps within an epoch (0: at epoch ends only).
    #[arg(long, value_name = "N", default_value_t = 0)]
    checkpoint_every: usize,
    /// Loader threads per rank.
    #[arg(long, default_value_t = 2, value_parser = |s: &str| parse::at_least(s, 1, "--workers", ""))]
    workers: usize,
    /// Sort windows of N batches by length to cut padding (0: off).
    #[arg(long, value_name = "N", default_value_t = 16)]
    bucket_window: usize,
    /// Split each rank's batch into N micro-batches run at once, one per
    /// thread, their gradients summed (0: one per thread of the rank).
    #[arg(long, value_name = "N", default_value_t = 0)]
    micro_batches: usize,
    /// Where parameters and optimizer state live: host (flat buffers, the CPU
    /// fast path) or backend (tensors on the backend's device, the GPU path).
    /// Default: host on the CPU, backend on a GPU.
    #[arg(long)]
    placement: Option<Placement>,
    /// The device: cpu, cuda (under `drove run`, the GPU of the rank's local
    /// rank, unless CUDA_VISIBLE_DEVICES shows one) or cuda:N. The GPU needs a
    /// drove built with `--features cuda,nccl`.
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// Dropout for every layer, overriding config.json (0 for exact comparisons).
    #[arg(long, value_name = "P", allow_negative_numbers = true,
          value_parser = |s: &str| parse::fraction(s, "--dropout"))]
    dropout: Option<f64>,
    /// Continue from the latest checkpoint under --out.
    #[arg(long)]
    resume: bool,
    /// Stop after N steps in this process (the schedule still spans the whole run).
    #[arg(long, value_name = "N")]
    max_steps: Option<u64>,
    /// Show progress every N steps when not on a terminal.
    #[arg(long, value_name = "N", default_value_t = 10)]
    log_every: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// Make rank --rank-to-fail kill itself with SIGKILL right after step N (a
    /// test of failure handling, --resume and restarts; only in the first
    /// attempt: never when DROVE_RESTART_COUNT is above 0).
    #[arg(long, value_name = "N", hide = true)]
    fail_at_step: Option<u64>,
    /// The rank that --fail-at-step kills.
    #[arg(long, value_name = "R", default_value_t = 0, hide = true, requires = "fail_at_step")]
    rank_to_fail: usize,
}

impl NerArgs {
    fn options(&self) -> NerOptions {
        NerOptions {
            data: self.data.clone(),
            model: self.model.clone(),
            out: self.out.clone(),
            epochs: self.epochs,
            batch_size: self.batch_size,
            lr: self.lr,
            lr_scaling: self.lr_scaling,
            warmup_fraction: self.warmup,
            adamw: AdamWSettings { weight_decay: self.weight_decay, ..AdamWSettings::default() },
            clip_norm: self.clip_norm,
            max_len: self.max_len,
            lowercase: !self.cased,
            augment_mask: self.augment_mask,
            seeding: self.seeding,
            seed: self.seed,
            diagnose_every: self.diagnose_every.unwrap_or(0),
            on_identical_masks: self.on_identical_masks,
            timeline: self.timeline.clone().or_else(|| std::env::var_os("DROVE_TIMELINE").map(PathBuf::from)),
            diagnose_parameter: self.diagnose_parameter.clone(),
            max_train_sentences: self.max_train_sentences,
            max_eval_sentences: self.max_eval_sentences,
            eval_sets: self.eval.iter().filter(|s| !s.is_empty()).cloned().collect(),
            checkpoint_every: self.checkpoint_every,
            workers: self.workers,
            micro_batches: micro_batches(self.micro_batches, self.device),
            placement: placement(self.placement, self.device),
            bucket_window: self.bucket_window,
            dropout: self.dropout,
            resume: self.resume,
            max_steps: self.max_steps,
            random_init: false,
        }
    }
}

/// The placement asked for, else the device's own: flat host buffers on the
/// CPU, tensors on the device on a GPU.
fn placement(asked: Option<Placement>, device: DeviceChoice) -> Placement {
    asked.unwrap_or(match device {
        DeviceChoice::Cpu => Placement::Host,
        DeviceChoice::Cuda(_) => Placement::Backend,
    })
}

/// On a GPU "one micro-batch per thread" (0) means one: the GPU runs the
/// whole batch; splitting it across CPU threads would only cut the kernels.
fn micro_batches(asked: usize, device: DeviceChoice) -> usize {
    match (asked, device) {
        (0, DeviceChoice::Cuda(_)) => 1,
        (n, _) => n,
    }
}

/// Progress on rank 0 and metrics on every rank.
struct Reporter {
    rank: usize,
    bar: Option<ProgressBar>,
    log_every: u64,
    metrics: Option<MetricsRecorder>,
    started: Instant,
    fail_at: Option<(u64, usize)>,
    /// `drove run` draws the bar (`DROVE_PROGRESS=launcher`): rank 0 sends it
    /// progress lines instead of printing step lines.
    to_launcher: bool,
}

impl Reporter {
    fn say(&self, line: &str) {
        if self.rank != 0 {
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    fn record(&self, step: u64, name: &str, value: f64) {
        if let Some(m) = &self.metrics
            && value.is_finite()
        {
            m.record(step as f64, name, value);
        }
    }
}

impl Observer for Reporter {
    fn started(&mut self, done: u64, total: u64) {
        if self.rank == 0 && self.to_launcher {
            eprintln!(
                "{}{}",
                crate::launch::PROGRESS_PREFIX,
                serde_json::json!({"step": done, "total": total})
            );
        } else if self.rank == 0 && std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total).with_position(done);
            bar.set_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps {msg}")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            self.bar = Some(bar);
        }
        self.started = Instant::now();
    }

    fn step(&mut self, r: &StepReport) {
        if self.fail_at == Some((r.step, self.rank)) {
            if let Some(m) = &self.metrics {
                let _ = m.flush(std::time::Duration::from_secs(30));
            }
            eprintln!(
                "rank {}: killing itself with SIGKILL after step {} (--fail-at-step)",
                self.rank, r.step
            );
            // SAFETY: kill(2) on this process; nothing is left to clean up.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        self.record(r.step, metric_names::LOSS, r.loss);
        self.record(r.step, metric_names::LR, r.lr);
        self.record(r.step, metric_names::GRAD_NORM, r.grad_norm);
        self.record(r.step, metric_names::SENTENCES_PER_S, r.sentences_per_s);
        self.record(r.step, metric_names::TOKENS_PER_S, r.tokens_per_s);
        self.record(r.step, metric_names::EPOCH, r.epoch as f64);
        if self.rank != 0 {
            return;
        }
        if self.to_launcher {
            let progress = serde_json::json!({
                "step": r.step, "total": r.total_steps, "epoch": r.epoch, "loss": r.loss,
                "sentences_per_s": r.sentences_per_s,
            });
            eprintln!("{}{progress}", crate::launch::PROGRESS_PREFIX);
            return;
        }
        let msg =
            format!("epoch {} loss {:.4} lr {:.2e} {:.1} sent/s", r.epoch, r.loss, r.lr, r.sentences_per_s);
        match &self.bar {
            Some(bar) => {
                bar.set_position(r.step);
                bar.set_message(msg);
            }
            None if r.step.is_multiple_of(self.log_every.max(1)) || r.step == r.total_steps => {
                eprintln!(
                    "step {}/{} {msg} ({:.0} s)",
                    r.step,
                    r.total_steps,
                    self.started.elapsed().as_secs_f64()
                );
            }
            None => {}
        }
    }

    fn evaluated(&mut self, r: &EvalReport) {
        self.record(r.step, &metric_names::f1(&r.set), r.f1);
        self.record(r.step, &metric_names::precision(&r.set), r.precision);
        self.record(r.step, &metric_names::recall(&r.set), r.recall);
        self.say(&format!(
            "epoch {} {}: entity F1 {:.4} (precision {:.4}, recall {:.4}; tp {} fp {} fn {})",
            r.epoch, r.set, r.f1, r.precision, r.recall, r.tp, r.fp, r.fn_
        ));
    }

    fn diagnosed(&mut self, r: &DiagnoseReport) {
        self.record(r.step, metric_names::MASK_AGREEMENT, r.mask_agreement);
        self.record(r.step, metric_names::MASK_AGREEMENT_EXPECTED, r.mask_expected);
        self.record(r.step, metric_names::MASK_AGREEMENT_SIGMA, r.mask_sigma);
        self.record(r.step, metric_names::GRAD_COSINE, r.grad_cosine);
        self.say(&format!(
            "step {}: mask agreement {:.4}, gradient cosine {:.4}",
            r.step, r.mask_agreement, r.grad_cosine
        ));
    }

    fn alarm(&mut self, r: &DiagnoseReport) {
        self.record(r.step, metric_names::DIVERSITY_ALARM, 1.0);
        if self.rank != 0 {
            return;
        }
        let message = r.masks.explain();
        self.say(&format!("warning: diversity alarm at step {}: {message}", r.step));
        if let Some(m) = &self.metrics
            && let Err(e) = m.event(
                r.step as f64,
                metric_names::event::DIVERSITY_ALARM,
                &message,
                std::time::Duration::from_secs(10),
            )
        {
            self.say(&format!("warning: {e}"));
        }
    }

    fn note(&mut self, message: &str) {
        self.say(message);
    }
}

fn print_summary(summary: &NerSummary, json_out: bool) {
    if json_out {
        println!("{}", serde_json::to_string(summary).expect("a summary serialises"));
        return;
    }
    match summary.test_f1 {
        Some(f1) => println!("test entity F1: {f1:.4}"),
        None => println!("test entity F1: not evaluated"),
    }
    match &summary.mask_agreement {
        Some(a) => println!(
            "mask agreement: {:.4} over {} diagnosed steps (independent masks: {:.4} +- {:.4}; {})",
            a.mean_agreement,
            a.steps,
            a.expected,
            a.sigma,
            if a.within_3_sigma {
                "within 3 sigma"
            } else if a.mean_agreement > a.expected {
                "ranks mask alike"
            } else {
                "below the band"
            }
        ),
        None => println!("mask agreement: not diagnosed (pass --diagnose-every N)"),
    }
    if let Some(alarm) = &summary.diversity_alarm {
        println!("diversity alarm: {alarm}");
    }
    match summary.grad_cosine {
        Some(c) => println!("gradient cosine: {c:.4} (mean over pairs of ranks and diagnosed steps)"),
        None => println!("gradient cosine: not diagnosed"),
    }
    println!(
        "trained {} steps on {} rank(s): {:.1} sentences/s, {:.0} tokens/s",
        summary.steps, summary.world_size, summary.sentences_per_s, summary.tokens_per_s
    );
}

fn under_launcher() -> bool {
    ["DROVE_COORDINATOR", "DROVE_RENDEZVOUS_DIR", "DROVE_PEERS", "DROVE_PEERS_FILE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The ranks a launcher started this process among, or a world of one.
pub fn communicator() -> anyhow::Result<Box<dyn Collective>> {
    Ok(if under_launcher() {
        Box::new(Communicator::from_env().context("joining the other ranks")?)
    } else {
        Box::new(SingleProcess)
    })
}

/// Steps between diagnostics when the alarm is on by default.
const DEFAULT_DIAGNOSE_EVERY: usize = 50;

/// The exit code of a run the diversity alarm stopped (`--on-identical-masks fail`).
pub const IDENTICAL_MASKS_EXIT: u8 = 3;

/// A coordinator that is down costs metrics, not the run: the training result
/// stands, with a warning naming what was not delivered.
fn close_metrics(reporter: &mut Reporter, rank: usize) {
    if let Some(m) = reporter.metrics.take() {
        let delivery = m.close();
        if delivery.undelivered() > 0 {
            eprintln!("warning: rank {rank}: {delivery}");
        }
    }
}

/// The run's settings as an `options` event of the run (what `drove report`
/// shows in its header): the options as resolved, the world size and the
/// restart, as one JSON object.
fn record_options(reporter: &Reporter, opts: &NerOptions, world_size: usize, restart: u32) {
    let Some(m) = &reporter.metrics else { return };
    let mut options = serde_json::to_value(opts).unwrap_or_default();
    if let Some(o) = options.as_object_mut() {
        // The name `--seeding` takes, not the enum's.
        o.insert("seeding".into(), opts.seeding.name().into());
        o.insert("world_size".into(), world_size.into());
        o.insert("restart".into(), restart.into());
    }
    if let Err(e) =
        m.event(0.0, metric_names::event::OPTIONS, &options.to_string(), std::time::Duration::from_secs(10))
    {
        reporter.say(&format!("warning: recording the run's options: {e}"));
    }
}

/// `DROVE_RESTART_COUNT`: how many times `drove run` has restarted the world (0 if unset).
fn restart_count() -> anyhow::Result<u32> {
    match std::env::var("DROVE_RESTART_COUNT") {
        Ok(v) => v.trim().parse().map_err(|_| anyhow!("DROVE_RESTART_COUNT={v:?} is not a whole number")),
        Err(_) => Ok(0),
    }
}

pub fn ner(args: &NerArgs) -> anyhow::Result<ExitCode> {
    let mut opts = args.options();
    // Restarted by `drove run --max-restarts`: go on from the latest checkpoint.
    let restart = restart_count()?;
    if restart > 0 && args.out.join("checkpoints").join("latest").exists() {
        opts.resume = true;
    }
    // Before joining the other ranks: a missing GPU fails at once.
    let gpu = gpu::open(args.device)?;
    let comm = communicator()?;
    let rank = comm.rank();
    // The diversity alarm is on by default wherever it can go off.
    if args.diagnose_every.is_none() && args.augment_mask > 0.0 && comm.world_size() > 1 {
        opts.diagnose_every = DEFAULT_DIAGNOSE_EVERY;
    }
    let metrics = match std::env::var("DROVE_COORDINATOR") {
        Ok(addr) => {
            let run_id = std::env::var("DROVE_RUN_ID").unwrap_or_else(|_| "train".into());
            let token = std::env::var("DROVE_TOKEN").ok();
            let options = RecorderOptions::from_env().context("the metrics settings")?;
            Some(
                MetricsRecorder::new(&addr, token.as_deref(), &run_id, rank, options)
                    .context("starting the metrics recorder")?,
            )
        }
        Err(_) => None,
    };
    let mut reporter = Reporter {
        rank,
        bar: None,
        log_every: args.log_every,
        metrics,
        started: Instant::now(),
        // A failure to test restarts with happens in the first attempt only.
        fail_at: args.fail_at_step.filter(|_| restart == 0).map(|s| (s, args.rank_to_fail)),
        to_launcher: std::env::var("DROVE_PROGRESS").is_ok_and(|v| v == "launcher"),
    };
    if rank == 0 {
        record_options(&reporter, &opts, comm.world_size(), restart);
    }
    let summary = match &gpu {
        None => train_ner::<Backend>(&opts, comm.as_ref(), &mut reporter, &Default::default()),
        Some(gpu) => gpu.train_ner(&opts, comm.as_ref(), &mut reporter),
    };
    let summary = match summary {
        Ok(s) => s,
        Err(e @ NerError::IdenticalMasks { .. }) => {
            close_metrics(&mut reporter, rank);
            eprintln!("error: rank {rank}: {e}");
            return Ok(ExitCode::from(IDENTICAL_MASKS_EXIT));
        }
        Err(e) => return Err(anyhow!("rank {rank}: {e}")),
    };
    if let Some(bar) = reporter.bar.take() {
        bar.finish_and_clear();
    }
    close_metrics(&mut reporter, rank);
    if rank == 0 {
        print_summary(&summary, args.json);
    }
    Ok(ExitCode::SUCCESS)
}

/// Settings of `drove bench train`.
#[derive(Debug, Args)]
pub struct TrainBenchArgs {
    /// Folder with the CoNLL-2003 files.
    #[arg(long, value_name = "DIR", default_value = "assets/conll2003")]
    data: PathBuf,
    /// Folder with the model.
    #[arg(long, value_name = "DIR", default_value = "assets/minilm")]
    model: PathBuf,
    /// Sentences per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Steps timed (after --warmup-steps untimed ones); bucketed batches vary in
    /// length, so fewer than ~50 give a noisy mean.
    #[arg(long, default_value_t = 60)]
    steps: u64,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    warmup_steps: u64,
    /// Sort windows of N batches by length (0: off, as a plain random sampler).
    #[arg(long, value_name = "N", default_value_t = 16)]
    bucket_window: usize,
    /// Micro-batches run at once (0: one per thread; 1: the whole batch on
    /// the backend's own threads).
    #[arg(long, value_name = "N", default_value_t = 0)]
    micro_batches: usize,
    /// Where parameters and optimizer state live: host or backend (default:
    /// host on the CPU, backend on a GPU).
    #[arg(long)]
    placement: Option<Placement>,
    /// The device: cpu, cuda or cuda:N (see `drove train ner --device`).
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// Start from random weights of the model's shape (config.json only; for
    /// throughput where the weights are not at hand).
    #[arg(long)]
    random_init: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Records each step's timing.
struct Timer {
    steps: Vec<(f64, f64)>, // (sentences/s, tokens/s)
    phases: Vec<drove_train::PhaseTimes>,
}

impl Observer for Timer {
    fn step(&mut self, r: &StepReport) {
        self.steps.push((r.sentences_per_s, r.tokens_per_s));
        self.phases.push(r.phases);
    }
}

/// Mean seconds per step of each phase over `phases`.
fn phase_means(phases: &[drove_train::PhaseTimes]) -> serde_json::Value {
    let n = phases.len().max(1) as f64;
    let mean = |f: fn(&drove_train::PhaseTimes) -> std::time::Duration| {
        phases.iter().map(|p| f(p).as_secs_f64()).sum::<f64>() / n
    };
    json!({
        "compute": mean(|p| p.compute),
        "all_reduce": mean(|p| p.all_reduce),
        "clip": mean(|p| p.clip),
        "update": mean(|p| p.update),
    })
}

/// Peak resident memory of this process, from /proc.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `drove bench train`.
pub fn bench(args: &TrainBenchArgs) -> anyhow::Result<()> {
    let out = tempfile::tempdir().context("creating a scratch folder")?;
    let gpu = gpu::open(args.device)?;
    let placement = placement(args.placement, args.device);
    let micro = micro_batches(args.micro_batches, args.device);
    let opts = NerOptions {
        data: args.data.clone(),
        model: args.model.clone(),
        out: out.path().to_path_buf(),
        epochs: 1,
        batch_size: args.batch_size,
        eval_sets: Vec::new(),
        bucket_window: args.bucket_window,
        micro_batches: micro,
        placement,
        max_steps: Some(args.warmup_steps + args.steps),
        random_init: args.random_init,
        ..NerOptions::default()
    };
    let mut timer = Timer { steps: Vec::new(), phases: Vec::new() };
    let started = Instant::now();
    match &gpu {
        None => train_ner::<Backend>(&opts, &SingleProcess, &mut timer, &Default::default()),
        Some(gpu) => gpu.train_ner(&opts, &SingleProcess, &mut timer),
    }
    .map_err(|e| anyhow!("{e}"))?;
    let wall = started.elapsed().as_secs_f64();
    let skip = args.warmup_steps.min(timer.steps.len() as u64) as usize;
    let timed = &timer.steps[skip..];
    // Harmonic means: total work over total time.
    let mean = |f: fn(&(f64, f64)) -> f64| timed.len() as f64 / timed.iter().map(|s| 1.0 / f(s)).sum::<f64>();
    let mut sorted: Vec<f64> = timed.iter().map(|s| s.0).collect();
    sorted.sort_by(f64::total_cmp);
    let report = json!({
        "benchmark": "train",
        "model": args.model.display().to_string(),
        "batch_size": args.batch_size,
        "bucket_window": args.bucket_window,
        "placement": placement.to_string(),
        "device": gpu.as_ref().map_or("cpu".into(), |g| g.name()),
        "random_init": args.random_init,
        "gpu_memory_used_bytes": gpu.as_ref().and_then(|g| g.memory_used_bytes()),
        "micro_batches": drove_train::micro::MicroBatches::resolve(micro, args.batch_size),
        "threads": std::env::var("RAYON_NUM_THREADS").ok()
            .and_then(|t| t.parse::<usize>().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        "steps_timed": timed.len(),
        "sentences_per_s": mean(|s| s.0),
        "tokens_per_s": mean(|s| s.1),
        "median_sentences_per_s": sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        "peak_rss_bytes": peak_rss_bytes(),
        // Host syncs per step on the backend placement: one per micro-batch
        // (its loss) and one for the norm (in "clip").
        "phase_mean_seconds": phase_means(&timer.phases[skip.min(timer.phases.len())..]),
        "wall_seconds_including_load": wall,
    });
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report).expect("json"));
    }
    Ok(())
}

//! `drove train ner`: fine-tunes a BERT for NER on CoNLL-format data, alone or as
//! one rank under `drove run --np N`.
//!
//! Under a launcher the ranks read their `drove_launch::LaunchEnv`, join
//! through its communicator and stream their metrics to the coordinator;
//! alone, the run is a world of one. Rank 0 shows progress (a bar on a terminal, a line every
//! `--log-every` steps otherwise), writes checkpoints and predictions under
//! `--out`, and prints the summary. (`drove bench train` is drove-bench's
//! training suite, called from `bench.rs`.)

use std::io::IsTerminal as _;
use std::time::Instant;

use anyhow::anyhow;
use clap::Args;
use drove_collective::{Collective, CommError, Elastic, WorldRange};
use drove_launch::{LaunchEnv, Launched, Progress, ProgressMode, RankOutcome, Ranks, Start};
use drove_ner::backend::{Autodiff, Flex};
use drove_ner::{
    DeviceChoice, DiagnoseReport, EvalReport, Gpu, GpuTraining as _, MetricsObserver, NerError, NerOptions,
    NerSummary, Observer, Placement, ReformReport, StepReport, train_ner, train_ner_elastic,
};

use crate::fault::{FaultArgs, Faulted};
use indicatif::{ProgressBar, ProgressStyle};
use std::process::ExitCode;

type Backend = Autodiff<Flex>;

/// Settings of `drove train ner`: the fine-tune's options (their flags are
/// drove-ner's, feature `clap`), and what only the command decides.
#[derive(Debug, Args)]
pub struct NerArgs {
    #[command(flatten)]
    options: NerOptions,
    /// Every N steps, compare the ranks' masks and local gradients (0: never)
    /// [default: 50 with --augment-mask above 0 on more than one rank, else 0].
    // The rule is drove-ner's: `NerOptions::default_diagnose_every`.
    #[arg(long, value_name = "N")]
    diagnose_every: Option<usize>,
    /// Where parameters and optimizer state live: host (flat buffers, the CPU
    /// fast path) or backend (tensors on the backend's device, the GPU path).
    /// Default: host on the CPU, backend on a GPU.
    #[arg(long)]
    placement: Option<Placement>,
    /// The device: cpu, cuda (under `drove run`, the GPU of the rank's local
    /// rank, unless CUDA_VISIBLE_DEVICES shows one), cuda:N, wgpu (any GPU
    /// with Vulkan, Metal or DX12; the adapter of the rank's local rank),
    /// wgpu:N, or help (list the devices and adapters found, and stop). CUDA
    /// needs a drove built with `--features cuda,nccl`, wgpu with `--features wgpu`.
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// Show progress every N steps when not on a terminal.
    #[arg(long, value_name = "N", default_value_t = 10)]
    log_every: u64,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    faults: FaultArgs,
    /// An elastic run of MIN to MAX ranks (torchrun's --nnodes MIN:MAX; N
    /// for N:N): a lost rank ends its world, not the run; the others keep
    /// their state in memory and go on in the next world, which ranks
    /// joining later enter at a step boundary. Needs a coordinator
    /// (DROVE_COORDINATOR); it buckets no batches by length [env: DROVE_ELASTIC].
    #[arg(long, value_name = "MIN:MAX")]
    world: Option<WorldRange>,
    /// Start from random weights of the model folder's config.json instead of
    /// its model.safetensors (tests of the loop's mechanics on a tiny model).
    #[arg(long, hide = true)]
    random_init: bool,
}

impl NerArgs {
    /// The options as given, with what the command resolves: the diagnostic's
    /// interval (0 unless given; `ner` turns it on where the alarm can go off),
    /// no empty evaluation set (`--eval ""` is none), and the device's own
    /// placement and micro-batches. (`ner` adds the launch environment's
    /// `DROVE_TIMELINE` for a `--timeline` not given.)
    fn options(&self) -> NerOptions {
        let opts = &self.options;
        NerOptions {
            diagnose_every: self.diagnose_every.unwrap_or(0),
            timeline: opts.timeline.clone(),
            eval_sets: opts.eval_sets.iter().filter(|s| !s.is_empty()).cloned().collect(),
            micro_batches: self.device.micro_batches(opts.micro_batches),
            // The device's own multiple where none is given (none on the CPU: 1).
            pad_multiple: opts.pad_multiple.or(Some(self.device.pad_multiple(None)).filter(|&n| n > 1)),
            placement: self.placement.unwrap_or(drove_ner::Placement::default_for(self.device)),
            random_init: self.random_init || opts.random_init,
            ..opts.clone()
        }
    }
}

/// Progress on rank 0 (a bar, log lines or the launcher's progress lines)
/// and, through drove-ner's `MetricsObserver`, metrics on every rank.
struct Reporter {
    progress: RankProgress,
    metrics: Option<MetricsObserver>,
}

impl Reporter {
    /// The events the coordinator did not take, as warnings.
    fn warn_undelivered(&mut self) {
        if let Some(m) = &mut self.metrics {
            for e in m.take_errors() {
                self.progress.say(&format!("warning: {e}"));
            }
        }
    }

    /// Delivers the metrics recorded so far (before a kill: --fail-at-step).
    fn flush_metrics(&self) {
        if let Some(m) = &self.metrics {
            let _ = m.recorder().flush(std::time::Duration::from_secs(30));
        }
    }
}

impl Observer for Reporter {
    fn started(&mut self, done: u64, total: u64) {
        self.progress.started(done, total);
    }

    fn step(&mut self, r: &StepReport) {
        if let Some(m) = &mut self.metrics {
            m.step(r);
        }
        self.progress.step(r);
    }

    fn evaluated(&mut self, r: &EvalReport) {
        if let Some(m) = &mut self.metrics {
            m.evaluated(r);
        }
        self.progress.evaluated(r);
    }

    fn diagnosed(&mut self, r: &DiagnoseReport) {
        if let Some(m) = &mut self.metrics {
            m.diagnosed(r);
        }
        self.progress.diagnosed(r);
    }

    fn alarm(&mut self, r: &DiagnoseReport) {
        self.progress.alarm(r);
        if let Some(m) = &mut self.metrics {
            m.alarm(r);
        }
        self.warn_undelivered();
    }

    fn reformed(&mut self, r: &ReformReport) {
        if let Some(m) = &mut self.metrics {
            m.reformed(r);
        }
        // Rank 0 of each world shows the progress (the first world's may be gone).
        self.progress.rank = r.rank;
        // Every member says where it is: the launcher prefixes its slot.
        eprintln!(
            "generation {}: this member is rank {} of {} at step {}, state {:016x}",
            r.generation, r.rank, r.world_size, r.step, r.fingerprint
        );
    }

    fn note(&mut self, message: &str) {
        self.progress.note(message);
    }
}

/// Trains on `ranks`, on `gpu` if one was opened, with the faults asked for.
fn train(
    ranks: &Ranks,
    opts: &NerOptions,
    gpu: Option<&Gpu>,
    observer: &mut Faulted<Reporter>,
    first_rank: usize,
) -> Result<NerSummary, NerError> {
    match ranks {
        Ranks::Fixed(comm) => {
            let faulty = observer.faults().collective(comm.as_ref(), first_rank);
            let comm: &dyn Collective = match &faulty {
                Some(faulty) => faulty,
                None => comm.as_ref(),
            };
            match gpu {
                None => train_ner::<Backend>(opts, comm, observer, &Default::default()),
                Some(gpu) => gpu.train_ner(opts, comm, observer),
            }
        }
        Ranks::Elastic(comm) => {
            let faulty = observer.faults().collective(comm.as_ref(), first_rank);
            let comm: &dyn Elastic = match &faulty {
                Some(faulty) => faulty,
                None => comm.as_ref(),
            };
            match gpu {
                None => train_ner_elastic::<Backend>(opts, comm, observer, &Default::default()),
                Some(gpu) => gpu.train_ner_elastic(opts, comm, observer),
            }
        }
    }
}

/// How the rank's run ended, for `Launched::finish`: a member left out is no
/// longer in the run (its error is its own).
fn outcome<'a>(summary: &Result<NerSummary, NerError>, error: Option<&'a str>) -> RankOutcome<'a> {
    match (summary, error) {
        (Ok(s), _) => RankOutcome::Finished { steps: s.steps },
        (Err(NerError::Comm(CommError::LeftOut(_))), Some(error)) => RankOutcome::LeftOut { error },
        (Err(_), error) => RankOutcome::Failed { steps: 0, error: error.unwrap_or_default() },
    }
}

/// What rank 0 shows as the run goes.
struct RankProgress {
    rank: usize,
    bar: Option<ProgressBar>,
    log_every: u64,
    started: Instant,
    /// `drove run` draws the bar (`DROVE_PROGRESS=launcher`): rank 0 sends it
    /// progress lines instead of printing step lines.
    to_launcher: bool,
}

impl RankProgress {
    fn say(&self, line: &str) {
        if self.rank != 0 {
            return;
        }
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }
}

impl Observer for RankProgress {
    fn started(&mut self, done: u64, total: u64) {
        if self.rank == 0 && self.to_launcher {
            Progress::at(done, total).send();
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
        if self.rank != 0 {
            return;
        }
        if self.to_launcher {
            let progress = Progress {
                epoch: Some(r.epoch as u64),
                loss: Some(r.loss),
                samples_per_s: Some(r.sentences_per_s),
                unit: Some("sent".into()),
                ..Progress::at(r.step, r.total_steps)
            };
            progress.send();
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
        self.say(&format!(
            "epoch {} {}: entity F1 {:.4} (precision {:.4}, recall {:.4}; tp {} fp {} fn {})",
            r.epoch, r.set, r.f1, r.precision, r.recall, r.tp, r.fp, r.fn_
        ));
    }

    fn diagnosed(&mut self, r: &DiagnoseReport) {
        self.say(&format!(
            "step {}: mask agreement {:.4}, gradient cosine {:.4}",
            r.step, r.mask_agreement, r.grad_cosine
        ));
    }

    fn alarm(&mut self, r: &DiagnoseReport) {
        self.say(&format!("warning: diversity alarm at step {}: {}", r.step, r.masks.explain()));
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
            a.verdict.meaning()
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
/// shows in its header).
fn record_options(reporter: &Reporter, opts: &NerOptions, world_size: usize, restart: u32) {
    let Some(m) = &reporter.metrics else { return };
    if let Err(e) = m.record_options(opts, world_size, restart) {
        reporter.progress.say(&format!("warning: recording the run's options: {e}"));
    }
}

pub fn ner(args: &NerArgs) -> anyhow::Result<ExitCode> {
    if args.device == DeviceChoice::List {
        print!("{}", drove_ner::list_devices());
        return Ok(ExitCode::SUCCESS);
    }
    let mut opts = args.options();
    let launch = LaunchEnv::from_env_elastic(args.world)?;
    if opts.timeline.is_none() {
        opts.timeline.clone_from(&launch.timeline);
    }
    // Restarted by `drove run --max-restarts`: go on from the latest checkpoint.
    let restart = launch.restart_count;
    if launch.start(&opts.out.join("checkpoints").join("latest")) == Start::Resume {
        opts.resume = true;
    }
    // Before joining the other ranks: a missing GPU fails at once.
    let gpu = drove_ner::open_gpu(args.device, launch.local_rank, &opts.kernel_cache, false)?;
    // Rank 0 serves the coordinator where the launcher names a place for it.
    let mut launched = Launched::from_launch_env(launch)?;
    let rank = launched.rank();
    if let Some(gpu) = &gpu {
        // Which GPU trains, named by every rank (the launcher prefixes its slot).
        eprintln!("rank {rank}: training on {}", gpu.describe());
    }
    if args.diagnose_every.is_none() {
        opts.diagnose_every = opts.default_diagnose_every(launched.world_size());
    }
    let reporter = Reporter {
        progress: RankProgress {
            rank,
            bar: None,
            log_every: args.log_every,
            started: Instant::now(),
            to_launcher: launched.env().progress == ProgressMode::Launcher,
        },
        metrics: launched.take_metrics().map(|m| MetricsObserver::new(m, rank)),
    };
    let faults = args.faults.faults(restart, gpu.as_ref())?;
    if rank == 0 {
        record_options(&reporter, &opts, launched.world_size(), restart);
    }
    let mut observer = Faulted::new(reporter, faults, rank, Reporter::flush_metrics);
    let summary = train(launched.ranks(), &opts, gpu.as_ref(), &mut observer, rank);
    let reporter = &mut observer.inner;
    if let Some(bar) = reporter.progress.bar.take() {
        bar.finish_and_clear();
    }
    // Each rank's last metrics are delivered before it leaves the run; under
    // mpirun or srun it leaves itself, and rank 0 keeps its coordinator up
    // until all have.
    close_metrics(reporter, rank);
    let error = summary.as_ref().err().map(ToString::to_string);
    launched.finish(outcome(&summary, error.as_deref()));
    match summary {
        Ok(summary) => {
            if rank == 0 {
                print_summary(&summary, args.json);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e @ NerError::IdenticalMasks { .. }) => {
            eprintln!("error: rank {rank}: {e}");
            Ok(ExitCode::from(IDENTICAL_MASKS_EXIT))
        }
        Err(e) => Err(anyhow!("rank {rank}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        args: NerArgs,
    }

    fn options(flags: &[&str]) -> NerOptions {
        let opts = Flags::parse_from(std::iter::once("ner").chain(flags.iter().copied())).args.options();
        // What the environment adds is not the flags' doing.
        NerOptions {
            timeline: opts.timeline.filter(|_| std::env::var_os(drove_launch::var::TIMELINE).is_none()),
            ..opts
        }
    }

    #[test]
    fn no_flags_are_the_default_options() {
        assert_eq!(options(&[]), NerOptions::default());
    }

    #[test]
    fn a_rank_to_fail_or_stall_needs_its_fault_and_a_lost_device_a_wgpu_one() {
        let parse =
            |flags: &[&str]| Flags::try_parse_from(std::iter::once("ner").chain(flags.iter().copied()));
        for alone in [&["--rank-to-fail", "1"][..], &["--rank-to-stall", "1"], &["--stall-secs", "2"]] {
            assert!(parse(alone).is_err(), "{alone:?} alone is refused");
        }
        for with in [
            &["--rank-to-fail", "1", "--fail-in-backward", "2"][..],
            &["--fail-at-step", "3", "--rank-to-fail", "1"],
        ] {
            assert!(parse(with).is_ok(), "{with:?}");
        }
        let lost = parse(&["--lose-device-at-step", "1"]).unwrap().args;
        let err = lost.faults.faults(0, None).err().expect("no device to lose").to_string();
        assert!(err.contains("--lose-device-at-step needs --device wgpu"), "{err}");
    }

    #[test]
    fn the_command_resolves_what_only_it_knows() {
        let opts = options(&["--eval", "", "--diagnose-every", "5", "--device", "cpu"]);
        assert_eq!(opts.eval_sets, Vec::<String>::new());
        assert_eq!(opts.diagnose_every, 5);
        assert_eq!(opts.placement, Placement::Host);
        assert_eq!(opts.micro_batches, 0);
        let gpu = options(&["--device", "cuda"]);
        assert_eq!((gpu.placement, gpu.micro_batches), (Placement::Backend, 1));
        assert_eq!((opts.pad_multiple, gpu.pad_multiple), (None, Some(16)), "padded on a GPU only");
        let asked = options(&["--device", "cuda", "--pad-multiple", "1"]);
        assert_eq!(asked.pad_multiple, Some(1), "a multiple given is kept");
    }
}

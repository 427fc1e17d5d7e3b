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
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;
use drove_comm::fault::{Faulty, Trigger};
use drove_comm::{Collective, CommError, Elastic, WorldRange};
use drove_launch::{LaunchEnv, Launched, Progress, ProgressMode, RankOutcome, Ranks, Start};
use drove_ner::backend::{Autodiff, Flex};
use drove_ner::{
    DeviceChoice, DiagnoseReport, EvalReport, Gpu, GpuTraining as _, MetricsObserver, NerError, NerOptions,
    NerSummary, Observer, Placement, ReformReport, StepReport, train_ner, train_ner_elastic,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::process::ExitCode;

type Backend = Autodiff<Flex>;

/// Settings of `drove train ner`: the fine-tune's options (their flags are
/// drove-ner's, feature `clap`), and what only the command decides.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("fault").args(["fail_at_step", "fail_in_backward"]).multiple(true)))]
pub struct NerArgs {
    #[command(flatten)]
    options: NerOptions,
    /// Every N steps, compare the ranks' masks and local gradients (0: never)
    /// [default: 50 with --augment-mask above 0 on more than one rank, else 0].
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
    /// Make rank --rank-to-fail kill itself with SIGKILL right after step N (a
    /// test of failure handling, --resume and restarts; only in the first
    /// attempt: never when DROVE_RESTART_COUNT is above 0).
    #[arg(long, value_name = "N", hide = true)]
    fail_at_step: Option<u64>,
    /// Make rank --rank-to-fail kill itself with SIGKILL in the middle of
    /// its N-th step's backward pass: at the step's second gradient
    /// all-reduce, the first bucket averaged on every rank and the rest not
    /// (a test of a rank lost while buckets are in flight; with --no-overlap
    /// the buckets go after backward). Only in the first attempt.
    #[arg(long, value_name = "N", hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    fail_in_backward: Option<u64>,
    /// The rank that --fail-at-step or --fail-in-backward kills (its rank in
    /// the first world of an elastic run).
    #[arg(long, value_name = "R", default_value_t = 0, hide = true, requires = "fault")]
    rank_to_fail: usize,
    /// Make rank --rank-to-stall stop for --stall-secs right after step N, its
    /// heartbeats going on (a test that a slow member is waited for, not
    /// lost; only in the first attempt).
    #[arg(long, value_name = "N", hide = true)]
    stall_at_step: Option<u64>,
    /// The rank that --stall-at-step stops.
    #[arg(long, value_name = "R", default_value_t = 0, hide = true, requires = "stall_at_step")]
    rank_to_stall: usize,
    /// How long --stall-at-step stops its rank.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, hide = true, requires = "stall_at_step")]
    stall_secs: f64,
    /// Destroy the wgpu device right after step N, as a driver reset would (a
    /// test that a device lost mid-run is an error naming it, not a panic).
    #[arg(long, value_name = "N", hide = true)]
    lose_device_at_step: Option<u64>,
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
    fail_at: Option<(u64, usize)>,
    /// (step, rank, how long): once.
    stall_at: Option<(u64, usize, Duration)>,
    /// --lose-device-at-step.
    lose_device_at: Option<LoseDevice>,
}

/// The device to destroy after a step (--lose-device-at-step), as a driver
/// reset would: the test of the device-lost path.
struct LoseDevice {
    step: u64,
    destroy: Box<dyn Fn()>,
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
}

impl Observer for Reporter {
    fn started(&mut self, done: u64, total: u64) {
        self.progress.started(done, total);
    }

    fn step(&mut self, r: &StepReport) {
        if self.fail_at == Some((r.step, self.progress.rank)) {
            if let Some(m) = &self.metrics {
                let _ = m.recorder().flush(std::time::Duration::from_secs(30));
            }
            eprintln!(
                "rank {}: killing itself with SIGKILL after step {} (--fail-at-step)",
                self.progress.rank, r.step
            );
            // SAFETY: kill(2) on this process; nothing is left to clean up.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
        if let Some((step, rank, secs)) = self.stall_at
            && (step, rank) == (r.step, self.progress.rank)
        {
            self.stall_at = None;
            eprintln!(
                "rank {rank}: stopping for {secs:.1?} after step {step}, heartbeats going on (--stall-at-step)"
            );
            std::thread::sleep(secs);
        }
        if let Some(lose) = &self.lose_device_at
            && lose.step == r.step
        {
            eprintln!(
                "rank {}: destroying the device after step {} (--lose-device-at-step)",
                self.progress.rank, lose.step
            );
            (lose.destroy)();
        }
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

/// What --lose-device-at-step destroys: the wgpu device `gpu` holds.
fn lose_device_at(step: Option<u64>, gpu: Option<&Gpu>) -> anyhow::Result<Option<LoseDevice>> {
    let Some(step) = step else { return Ok(None) };
    #[cfg(feature = "wgpu")]
    if let Some(adapter) = gpu.and_then(Gpu::adapter).cloned() {
        return Ok(Some(LoseDevice { step, destroy: Box::new(move || adapter.destroy()) }));
    }
    let _ = (step, gpu);
    Err(anyhow!("--lose-device-at-step needs --device wgpu"))
}

/// Trains on `ranks`, on `gpu` if one was opened; this process killed in
/// the backward pass of its step `killed_at` (--fail-in-backward), if set.
fn train(
    ranks: &Ranks,
    opts: &NerOptions,
    gpu: Option<&Gpu>,
    reporter: &mut Reporter,
    killed_at: Option<u64>,
) -> Result<NerSummary, NerError> {
    match ranks {
        Ranks::Fixed(comm) => {
            let faulty = killed_at.map(|step| killed_in_backward(comm.as_ref(), step));
            let comm: &dyn Collective = match &faulty {
                Some(faulty) => faulty,
                None => comm.as_ref(),
            };
            match gpu {
                None => train_ner::<Backend>(opts, comm, reporter, &Default::default()),
                Some(gpu) => gpu.train_ner(opts, comm, reporter),
            }
        }
        Ranks::Elastic(comm) => {
            let faulty = killed_at.map(|step| killed_in_backward(comm.as_ref(), step));
            let comm: &dyn Elastic = match &faulty {
                Some(faulty) => faulty,
                None => comm.as_ref(),
            };
            match gpu {
                None => train_ner_elastic::<Backend>(opts, comm, reporter, &Default::default()),
                Some(gpu) => gpu.train_ner_elastic(opts, comm, reporter),
            }
        }
    }
}

/// `comm`, this process killed with SIGKILL at the second gradient op
/// (`gradients.bucket...`) of its `step`-th step (each step starts with one
/// `step.counts` all-reduce): with the all-reduce overlapped, in the middle
/// of backward, the first bucket averaged on every rank (--fail-in-backward).
fn killed_in_backward<C: Collective + ?Sized>(comm: &C, step: u64) -> Faulty<'_, C> {
    let trigger = Trigger::named("gradients.*").nth(2).after(Trigger::named("step.counts").nth(step));
    Faulty::new(comm, trigger).on_strike(move |comm, op| {
        eprintln!(
            "rank {}: killing itself with SIGKILL in the backward pass of step {step}, at {op} (--fail-in-backward)",
            comm.rank()
        );
        // SAFETY: kill(2) on this process; nothing is left to clean up.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    })
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
    // The diversity alarm is on by default wherever it can go off.
    if args.diagnose_every.is_none() && opts.augment_mask > 0.0 && launched.world_size() > 1 {
        opts.diagnose_every = DEFAULT_DIAGNOSE_EVERY;
    }
    let mut reporter = Reporter {
        progress: RankProgress {
            rank,
            bar: None,
            log_every: args.log_every,
            started: Instant::now(),
            to_launcher: launched.env().progress == ProgressMode::Launcher,
        },
        metrics: launched.take_metrics().map(|m| MetricsObserver::new(m, rank)),
        // A failure to test restarts with happens in the first attempt only.
        fail_at: args.fail_at_step.filter(|_| restart == 0).map(|s| (s, args.rank_to_fail)),
        stall_at: args.stall_at_step.filter(|_| restart == 0).map(|s| {
            (s, args.rank_to_stall, Duration::try_from_secs_f64(args.stall_secs).unwrap_or_default())
        }),
        lose_device_at: lose_device_at(args.lose_device_at_step, gpu.as_ref())?,
    };
    if rank == 0 {
        record_options(&reporter, &opts, launched.world_size(), restart);
    }
    // Likewise a kill in backward, of the rank of the first world it names.
    let killed_at = args.fail_in_backward.filter(|_| restart == 0 && rank == args.rank_to_fail);
    let summary = train(launched.ranks(), &opts, gpu.as_ref(), &mut reporter, killed_at);
    if let Some(bar) = reporter.progress.bar.take() {
        bar.finish_and_clear();
    }
    // Each rank's last metrics are delivered before it leaves the run; under
    // mpirun or srun it leaves itself, and rank 0 keeps its coordinator up
    // until all have.
    close_metrics(&mut reporter, rank);
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

//! The training suite: drove-ner's fine-tune at one rank, its throughput
//! (sentences and tokens per second over the timed steps), where the time of
//! a step goes, and the peak memory.
//!
//! Where it trains is a [`Trainer`]: [`Cpu`] here, or a GPU the caller opened
//! (`drove bench train --device cuda` passes the CLI's own, which also trains
//! `drove train ner`), so that this crate does not wire a GPU backend of its own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use drove_collective::SingleProcess;
use drove_device::DeviceChoice;
use drove_device::kernels::KernelCache;
use drove_kernels::transfer::{self, Transfers};
use drove_ner::{
    GpuStep, GpuTraining as _, NerError, NerOptions, NerSummary, Observer, StepReport, train_ner,
};
use drove_train::{PhaseTimes, Placement};
use serde::Serialize;

use crate::error::Doing as _;
use crate::{BenchError, median};

/// Settings of the training suite (`drove bench train`, which adds `--device`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct TrainOptions {
    /// Folder with the CoNLL-2003 files.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", default_value = "assets/conll2003"))]
    pub data: PathBuf,
    /// Folder with the model.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", default_value = "assets/minilm"))]
    pub model: PathBuf,
    /// Sentences per batch.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 32))]
    pub batch_size: usize,
    /// Steps timed (after --warmup-steps untimed ones); bucketed batches vary in
    /// length, so fewer than ~50 give a noisy mean.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 60))]
    pub steps: u64,
    /// Untimed steps first.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2))]
    pub warmup_steps: u64,
    /// Sort windows of N batches by length (0: off, as a plain random sampler).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 16))]
    pub bucket_window: usize,
    /// Micro-batches run at once (0: one per thread; 1: the whole batch on
    /// the backend's own threads).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 0))]
    pub micro_batches: usize,
    /// Where parameters and optimizer state live: host or backend (default:
    /// host on the CPU, backend on a GPU).
    #[cfg_attr(feature = "clap", arg(long))]
    pub placement: Option<Placement>,
    /// Start from random weights of the model's shape (config.json only; for
    /// throughput where the weights are not at hand).
    #[cfg_attr(feature = "clap", arg(long))]
    pub random_init: bool,
    /// Pad each batch's length up to a multiple of N [default: 16 on a GPU,
    /// 1 on the CPU].
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub pad_multiple: Option<usize>,
    /// Where a GPU keeps compiled kernels and autotune results between runs:
    /// a folder, `default` ($DROVE_KERNEL_CACHE, else ~/.cache/drove/kernels)
    /// or `off`.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR|default|off", default_value = "default"))]
    pub kernel_cache: KernelCache,
    /// How a step is computed on a GPU (each change of issue 49 on or off).
    #[cfg_attr(feature = "clap", command(flatten))]
    pub gpu_step: GpuStep,
    /// Count the kernels every step launches (a GPU; cubecl's execution log,
    /// which costs host time on the thread that launches: the timed steps
    /// are slower with it, so it is off unless asked).
    #[cfg_attr(feature = "clap", arg(long))]
    pub count_launches: bool,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            data: "assets/conll2003".into(),
            model: "assets/minilm".into(),
            batch_size: 32,
            steps: 60,
            warmup_steps: 2,
            bucket_window: 16,
            micro_batches: 0,
            placement: None,
            random_init: false,
            pad_multiple: None,
            kernel_cache: KernelCache::Default,
            gpu_step: GpuStep::default(),
            count_launches: false,
        }
    }
}

/// Where the suite trains: a device and the fine-tune on it.
pub trait Trainer {
    /// The device, as `--device` names it (a GPU by its number: `cuda:0`).
    fn device(&self) -> DeviceChoice;

    /// Fine-tunes with `options` at one rank, `observer` seeing every step.
    fn train(&self, options: &NerOptions, observer: &mut dyn Observer) -> Result<NerSummary, NerError>;

    /// Bytes of device memory in use, where the device tells (a GPU's driver).
    fn memory_used_bytes(&self) -> Option<u64> {
        None
    }

    /// The adapter that trains, where there is one to name (wgpu: its name,
    /// kind, graphics API and driver).
    fn adapter(&self) -> Option<String> {
        None
    }

    /// Kernels launched so far in this process, where they are counted (a
    /// GPU opened with counting on).
    fn kernels_launched(&self) -> Option<u64> {
        None
    }

    /// Kernels compiled so far in this process, where they are counted
    /// apart from the kernel cache (wgpu).
    fn kernels_compiled(&self) -> Option<u64> {
        None
    }

    /// The folder compiled kernels are kept in, where there is one.
    fn kernel_cache(&self) -> Option<PathBuf> {
        None
    }
}

/// The CPU: burn's `flex` backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Trainer for Cpu {
    fn device(&self) -> DeviceChoice {
        DeviceChoice::Cpu
    }

    fn train(&self, options: &NerOptions, observer: &mut dyn Observer) -> Result<NerSummary, NerError> {
        train_ner::<Autodiff<Flex>>(options, &SingleProcess, observer, &Default::default())
    }
}

/// A GPU drove-device opened (`--device cuda[:N]`): the same fine-tune as
/// `drove train ner`'s there.
impl Trainer for drove_device::Gpu {
    fn device(&self) -> DeviceChoice {
        drove_device::Gpu::device(self)
    }

    fn train(&self, options: &NerOptions, observer: &mut dyn Observer) -> Result<NerSummary, NerError> {
        self.train_ner(options, &SingleProcess, observer)
    }

    fn memory_used_bytes(&self) -> Option<u64> {
        drove_device::Gpu::memory_used_bytes(self)
            .map_err(|e| tracing::warn!("GPU memory in use: {e}"))
            .ok()
            .flatten()
    }

    fn adapter(&self) -> Option<String> {
        Some(self.describe())
    }

    fn kernels_launched(&self) -> Option<u64> {
        self.kernels().counting.launches.then(drove_device::kernels::launched)
    }

    fn kernels_compiled(&self) -> Option<u64> {
        self.kernels().counting.compiles.then(drove_device::kernels::compiled)
    }

    fn kernel_cache(&self) -> Option<PathBuf> {
        self.kernels().cache.clone()
    }
}

/// What the training suite reports (the JSON of `drove bench train`). The
/// fields are in the order of their names: the JSON's keys always were.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainReport {
    /// The device that trained, named (a GPU's adapter, driver and API).
    pub adapter: Option<String>,
    /// Sentences per batch.
    pub batch_size: usize,
    /// `train`.
    pub benchmark: &'static str,
    /// The bucketing window.
    pub bucket_window: usize,
    /// `cpu`, `cuda:N` or `wgpu:N`.
    pub device: String,
    /// Seconds of the first step (its phases): on a GPU, mostly compiling
    /// the kernels (wgpu's shaders), which no later step pays again.
    pub first_step_seconds: f64,
    /// GPU memory in use at the end (all processes), on a GPU.
    pub gpu_memory_used_bytes: Option<u64>,
    /// The kernel cache folder, if any.
    pub kernel_cache: Option<String>,
    /// Kernels compiled in this run (wgpu: counted as compiled; CUDA: the
    /// entries its PTX cache gained; `None` where neither tells).
    pub kernels_compiled: Option<u64>,
    /// Kernels compiled after the first step, where the device counts
    /// compiles (wgpu, with `--count-launches`): 0 once the pre-warm pass
    /// (`--prewarm on`) has compiled every padded length.
    pub kernels_compiled_after_first_step: Option<u64>,
    /// Kernels launched per step, on average over the steps after the first
    /// (over the one step of a one-step run), where the device counts them
    /// (`--count-launches`).
    pub kernels_launched_per_step: Option<f64>,
    /// The median of the timed steps' sentences per second.
    pub median_sentences_per_s: f64,
    /// Micro-batches a step ran.
    pub micro_batches: usize,
    /// The model folder.
    pub model: String,
    /// What batch lengths were padded up to a multiple of.
    pub pad_multiple: usize,
    /// Peak resident memory of this process, from /proc.
    pub peak_rss_bytes: Option<u64>,
    /// Mean seconds per timed step of each phase. Host syncs per step on the
    /// backend placement: one per micro-batch (its loss) and one for the norm
    /// (in `clip`).
    pub phase_mean_seconds: PhaseMeans,
    /// `host` or `backend`.
    pub placement: String,
    /// Whether the weights were random.
    pub random_init: bool,
    /// Sentences per second over the timed steps (total work over total time).
    pub sentences_per_s: f64,
    /// Mean seconds of a timed step (the sum of its phases).
    pub step_mean_seconds: f64,
    /// Steps timed.
    pub steps_timed: usize,
    /// rayon's threads (`RAYON_NUM_THREADS`, else the CPUs).
    pub threads: usize,
    /// Tokens per second over the timed steps (total work over total time).
    pub tokens_per_s: f64,
    /// Blocking reads (the host waiting for the device) and uploads per
    /// timed step at drove's own call sites (drove-kernels' counters): the
    /// mean over the timed steps, and the most any timed step made.
    pub transfers_per_step: TransfersPerStep,
    /// Seconds of the whole run, loading the data and model included.
    pub wall_seconds_including_load: f64,
}

/// Mean seconds per step of each phase (keys in the order of their names).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[allow(missing_docs)] // drove_train::PhaseTimes' fields.
pub struct PhaseMeans {
    pub all_reduce: f64,
    pub clip: f64,
    pub compute: f64,
    pub update: f64,
}

/// Reads and uploads per timed step (keys in the order of their names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct TransfersPerStep {
    /// Most reads of one timed step.
    pub max_reads: u64,
    /// Most uploads of one timed step.
    pub max_uploads: u64,
    /// Mean reads of a timed step.
    pub reads: f64,
    /// Mean uploads of a timed step.
    pub uploads: f64,
}

impl TransfersPerStep {
    /// Over `steps`, each step's count.
    fn over(steps: &[Transfers]) -> TransfersPerStep {
        let n = steps.len().max(1) as f64;
        TransfersPerStep {
            max_reads: steps.iter().map(|t| t.reads).max().unwrap_or(0),
            max_uploads: steps.iter().map(|t| t.uploads).max().unwrap_or(0),
            reads: steps.iter().map(|t| t.reads).sum::<u64>() as f64 / n,
            uploads: steps.iter().map(|t| t.uploads).sum::<u64>() as f64 / n,
        }
    }
}

/// Records each step's timing and transfers.
struct Timer<'a> {
    /// Kernels launched so far, where they are counted (`--count-launches`).
    launches: Option<&'a dyn Fn() -> Option<u64>>,
    /// The launches counted by the end of the first step: launches per step
    /// are counted from there, so that what ran before the first step (the
    /// pre-warm pass) is not taken for a step's.
    after_first: Option<u64>,
    /// Kernels compiled so far, where they are counted (wgpu).
    compiles: Option<&'a dyn Fn() -> Option<u64>>,
    /// The compiles counted by the end of the first step.
    compiled_after_first: Option<u64>,
    steps: Vec<(f64, f64)>, // (sentences/s, tokens/s)
    phases: Vec<PhaseTimes>,
    /// The transfers counted by the end of the last step seen.
    last: Transfers,
    /// Each step's transfers (those between its end and the previous one's).
    transfers: Vec<Transfers>,
}

impl<'a> Timer<'a> {
    /// A timer with no step seen; `launches` counts kernels launched where
    /// they are counted.
    fn new(launches: Option<&'a dyn Fn() -> Option<u64>>, compiles: &'a dyn Fn() -> Option<u64>) -> Self {
        let (steps, phases, transfers, last) = (Vec::new(), Vec::new(), Vec::new(), transfer::transfers());
        let (after_first, compiled_after_first) = (None, None);
        Timer {
            launches,
            after_first,
            compiles: Some(compiles),
            compiled_after_first,
            steps,
            phases,
            last,
            transfers,
        }
    }

    /// Kernels compiled since the end of the first step (`None` where
    /// compiles are not counted, or no step ran).
    fn compiled_since_first(&self) -> Option<u64> {
        let now = (self.compiles?)()?;
        self.compiled_after_first.map(|first| now.saturating_sub(first))
    }

    /// Kernels launched a step: over the steps after the first where there
    /// are some (the first also carries whatever ran before it), else over
    /// the one step since `before`; `None` where launches are not counted.
    fn launches_per_step(&self, before: Option<u64>) -> Option<f64> {
        let launches = self.launches?;
        match (self.after_first, self.steps.len()) {
            (Some(first), n) if n > 1 => {
                settled(launches).map(|after| after.saturating_sub(first) as f64 / (n - 1) as f64)
            }
            (_, n) => before
                .zip(settled(launches))
                .map(|(b, after)| after.saturating_sub(b) as f64 / n.max(1) as f64),
        }
    }
}

impl Observer for Timer<'_> {
    fn step(&mut self, r: &StepReport) {
        // RUST_LOG=drove_bench=debug shows each step (where a first step's
        // compiling and autotuning goes, on a GPU).
        tracing::debug!(
            step = r.step,
            seconds = step_seconds(&r.phases),
            sentences_per_s = r.sentences_per_s,
            "step"
        );
        self.steps.push((r.sentences_per_s, r.tokens_per_s));
        self.phases.push(r.phases);
        let now = transfer::transfers();
        self.transfers.push(now - self.last);
        self.last = now;
        if self.steps.len() == 1 {
            self.after_first = self.launches.and_then(settled);
            self.compiled_after_first = self.compiles.and_then(|compiles| compiles());
        }
    }
}

/// Seconds of one step: the sum of its phases.
fn step_seconds(p: &PhaseTimes) -> f64 {
    (p.compute + p.all_reduce + p.clip + p.update).as_secs_f64()
}

/// Mean seconds per step of each phase over `phases`.
fn phase_means(phases: &[PhaseTimes]) -> PhaseMeans {
    let n = phases.len().max(1) as f64;
    let mean = |f: fn(&PhaseTimes) -> Duration| phases.iter().map(|p| f(p).as_secs_f64()).sum::<f64>() / n;
    PhaseMeans {
        all_reduce: mean(|p| p.all_reduce),
        clip: mean(|p| p.clip),
        compute: mean(|p| p.compute),
        update: mean(|p| p.update),
    }
}

/// Peak resident memory of this process, from /proc.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The launch count once cubecl's logger thread has caught up: read until
/// two reads 50 ms apart agree, for at most 2 s (its notes are delivered
/// asynchronously; a count still moving after that is reported as read).
fn settled(read: impl Fn() -> Option<u64>) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut last = read()?;
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = read()?;
        if now == last || Instant::now() > deadline {
            return Some(now);
        }
        last = now;
    }
}

/// Trains `o.warmup_steps + o.steps` steps of one epoch on `trainer` (no
/// evaluation, output in a scratch folder) and reports the timed ones.
pub fn run(o: &TrainOptions, trainer: &dyn Trainer) -> Result<TrainReport, BenchError> {
    let out = tempfile::tempdir().doing("creating a scratch folder")?;
    let device = trainer.device();
    let placement = o.placement.unwrap_or(drove_train::Placement::default_for(device));
    let micro = device.micro_batches(o.micro_batches);
    let pad_multiple = device.pad_multiple(o.pad_multiple);
    let cache = trainer.kernel_cache();
    let cached_before = cache.as_deref().map(drove_device::kernels::cached_kernels);
    let launched_before = trainer.kernels_launched();
    let compiled_before = trainer.kernels_compiled();
    let opts = NerOptions {
        data: o.data.clone(),
        model: o.model.clone(),
        out: out.path().to_path_buf(),
        // Enough epochs for the steps, whatever the batch (every epoch has at
        // least one step); --max-steps stops it. The schedule spans them all.
        epochs: (o.warmup_steps + o.steps).max(1) as usize,
        batch_size: o.batch_size,
        pad_multiple: Some(pad_multiple),
        kernel_cache: o.kernel_cache.clone(),
        eval_sets: Vec::new(),
        bucket_window: Some(o.bucket_window),
        micro_batches: micro,
        placement,
        max_steps: Some(o.warmup_steps + o.steps),
        random_init: o.random_init,
        gpu_step: o.gpu_step.clone(),
        ..NerOptions::default()
    };
    let started = Instant::now();
    let launches = || trainer.kernels_launched();
    let compiles = || trainer.kernels_compiled();
    let mut timer =
        Timer::new(launched_before.is_some().then_some(&launches as &dyn Fn() -> Option<u64>), &compiles);
    trainer.train(&opts, &mut timer).map_err(BenchError::Ner)?;
    let wall = started.elapsed().as_secs_f64();
    let kernels_launched_per_step = timer.launches_per_step(launched_before);
    // Counted as compiled where the device says (wgpu), else as the entries
    // the kernel cache gained (CUDA's PTX cache).
    let kernels_compiled = match compiled_before.zip(trainer.kernels_compiled()) {
        Some((before, after)) => Some(after.saturating_sub(before)),
        None => cache
            .as_deref()
            .zip(cached_before)
            .map(|(dir, before)| drove_device::kernels::cached_kernels(dir).saturating_sub(before)),
    };
    let skip = o.warmup_steps.min(timer.steps.len() as u64) as usize;
    let timed = &timer.steps[skip..];
    // Harmonic means: total work over total time.
    let mean = |f: fn(&(f64, f64)) -> f64| timed.len() as f64 / timed.iter().map(|s| 1.0 / f(s)).sum::<f64>();
    let timed_phases = &timer.phases[skip.min(timer.phases.len())..];
    Ok(TrainReport {
        adapter: trainer.adapter(),
        batch_size: o.batch_size,
        benchmark: "train",
        bucket_window: o.bucket_window,
        device: device.to_string(),
        first_step_seconds: timer.phases.first().map_or(0.0, step_seconds),
        gpu_memory_used_bytes: trainer.memory_used_bytes(),
        kernel_cache: cache.map(|d| d.display().to_string()),
        kernels_compiled,
        kernels_compiled_after_first_step: timer.compiled_since_first(),
        kernels_launched_per_step,
        median_sentences_per_s: median(timed.iter().map(|s| s.0).collect()).unwrap_or(0.0),
        micro_batches: drove_train::micro::MicroBatches::resolve(micro, o.batch_size),
        model: o.model.display().to_string(),
        transfers_per_step: TransfersPerStep::over(&timer.transfers[skip.min(timer.transfers.len())..]),
        pad_multiple,
        peak_rss_bytes: peak_rss_bytes(),
        phase_mean_seconds: phase_means(timed_phases),
        placement: placement.to_string(),
        random_init: o.random_init,
        sentences_per_s: mean(|s| s.0),
        step_mean_seconds: timed_phases.iter().map(step_seconds).sum::<f64>()
            / timed_phases.len().max(1) as f64,
        steps_timed: timed.len(),
        threads: std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|t| t.parse::<usize>().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        tokens_per_s: mean(|s| s.1),
        wall_seconds_including_load: wall,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_s_keys_are_in_the_order_of_their_names() {
        let report = TrainReport {
            adapter: None,
            batch_size: 1,
            benchmark: "train",
            bucket_window: 0,
            device: "cpu".into(),
            first_step_seconds: 1.0,
            gpu_memory_used_bytes: None,
            kernel_cache: None,
            kernels_compiled: None,
            kernels_compiled_after_first_step: None,
            kernels_launched_per_step: None,
            median_sentences_per_s: 1.0,
            micro_batches: 1,
            model: "m".into(),
            transfers_per_step: TransfersPerStep::default(),
            pad_multiple: 1,
            peak_rss_bytes: Some(1),
            phase_mean_seconds: phase_means(&[]),
            placement: "host".into(),
            random_init: true,
            sentences_per_s: 1.0,
            step_mean_seconds: 1.0,
            steps_timed: 1,
            threads: 1,
            tokens_per_s: 1.0,
            wall_seconds_including_load: 1.0,
        };
        let text = serde_json::to_string(&report).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(text, value.to_string(), "a struct's JSON as a sorted map's");
        assert_eq!(value["gpu_memory_used_bytes"], serde_json::Value::Null);
    }

    #[cfg(feature = "clap")]
    #[test]
    fn no_flags_are_the_default_options() {
        assert_eq!(crate::flags::parsed_from_no_flags::<TrainOptions>(), TrainOptions::default());
    }
}

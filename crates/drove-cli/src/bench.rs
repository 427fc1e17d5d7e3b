//! `drove bench ...`: the flags of each suite (drove-bench's options, feature
//! `clap`, and `--json`), the call, and the report printed as one JSON object
//! or as its table. The suites themselves are `drove_bench`'s.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use drove_bench::allreduce::{AllreduceOptions, WorkerCommand, WorkerOptions};
use drove_bench::coordinator::CoordinatorOptions;
use drove_bench::mask::MaskOptions;
use drove_bench::matmul::MatmulOptions;
use drove_bench::nccl::NcclOptions;
use drove_bench::scaling::ScalingOptions;
use drove_bench::train::{Cpu, TrainOptions, Trainer};
use drove_ner::DeviceChoice;
use serde::Serialize;

/// Settings of `drove bench mask`.
#[derive(Debug, Args)]
pub struct MaskArgs {
    #[command(flatten)]
    options: MaskOptions,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Settings of `drove bench allreduce`.
#[derive(Debug, Args)]
pub struct AllreduceArgs {
    #[command(flatten)]
    options: AllreduceOptions,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Settings of `drove bench coordinator`.
#[derive(Debug, Args)]
pub struct CoordinatorArgs {
    #[command(flatten)]
    options: CoordinatorOptions,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Settings of `drove bench train`.
#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    options: TrainOptions,
    /// The device: cpu, cuda, cuda:N, wgpu, wgpu:N or help (see `drove train ner --device`).
    #[arg(long, default_value = "cpu")]
    device: DeviceChoice,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Settings of `drove bench scaling`.
#[derive(Debug, Args)]
pub struct ScalingArgs {
    #[command(flatten)]
    options: ScalingOptions,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Settings of `drove bench nccl`.
#[derive(Debug, Args)]
pub struct NcclArgs {
    #[command(flatten)]
    options: NcclOptions,
    /// Instead of timing, prove the in-place path of training: the gradient
    /// bucket all-reduce and an all-gather in both directions on burn tensors
    /// of each layout (own buffer, shared clone, view at an offset, piece of a
    /// split, broadcast), every result read back through burn and compared bit
    /// for bit. Exit code 1 when a check fails (after printing the report).
    #[arg(long)]
    buckets: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Settings of `drove bench matmul`.
#[derive(Debug, Args)]
pub struct MatmulArgs {
    #[command(flatten)]
    options: MatmulOptions,
    /// The GPU: cuda, cuda:N, wgpu or wgpu:N.
    #[arg(long, default_value = "cuda")]
    device: DeviceChoice,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// `report` as one JSON line, or as `text` (its table).
fn print(report: &impl Serialize, json: bool, text: impl FnOnce() -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{}", text());
    }
    Ok(())
}

/// `drove bench mask`.
pub fn mask(args: &MaskArgs) -> anyhow::Result<()> {
    let report = drove_bench::mask::run(&args.options)?;
    print(&report, args.json, || report.to_string())
}

/// `drove bench allreduce`: the ranks are this executable's `bench allreduce-worker`.
pub fn allreduce(args: &AllreduceArgs) -> anyhow::Result<()> {
    let program = std::env::current_exe().context("locating the drove executable")?;
    let worker = WorkerCommand { program, args: vec!["bench".into(), "allreduce-worker".into()] };
    let report = drove_bench::allreduce::run(&args.options, &worker)?;
    print(&report, args.json, || report.to_string())
}

/// `drove bench allreduce-worker`: one rank; rank 0 prints one JSON row a line.
pub fn allreduce_worker(options: &WorkerOptions) -> anyhow::Result<()> {
    for row in drove_bench::allreduce::worker(options)? {
        println!("{}", serde_json::to_string(&row)?);
    }
    Ok(())
}

/// `drove bench coordinator` (no spinner with `--json`).
pub fn coordinator(args: &CoordinatorArgs) -> anyhow::Result<()> {
    let options = CoordinatorOptions { progress: !args.json, ..args.options.clone() };
    let report = drove_bench::coordinator::run(&options)?;
    print(&report, args.json, || report.to_string())
}

/// `drove bench train`, on the CPU or on the GPU `--device` names.
pub fn train(args: &TrainArgs) -> anyhow::Result<()> {
    if args.device == DeviceChoice::List {
        print!("{}", drove_ner::list_devices());
        return Ok(());
    }
    // Launches are counted (cubecl's execution notes, no sync) when asked.
    let local_rank = drove_launch::LaunchEnv::from_env()?.local_rank;
    let gpu = drove_ner::open_gpu(
        args.device,
        local_rank,
        &args.options.kernel_cache,
        args.options.count_launches,
    )?;
    if let Some(gpu) = &gpu {
        // Named at start, on stderr (the JSON stays alone on stdout).
        eprintln!("training on {}", gpu.describe());
    }
    let trainer: &dyn Trainer = match &gpu {
        Some(gpu) => gpu,
        None => &Cpu,
    };
    let report = drove_bench::train::run(&args.options, trainer)?;
    print(&report, args.json, || serde_json::to_string_pretty(&report).expect("json") + "\n")
}

/// `drove bench scaling`: one rank of a training run at the world size of
/// the launcher it runs under (1 alone); rank 0 prints the report.
pub fn scaling(args: &ScalingArgs) -> anyhow::Result<()> {
    let launched = drove_launch::Launched::join()?;
    let rank = launched.rank();
    let result = drove_bench::scaling::run(&args.options, launched.comm());
    let error = result.as_ref().err().map(|e| e.to_string());
    let outcome = match (&result, &error) {
        (Ok(report), _) => drove_launch::RankOutcome::Finished { steps: report.steps_timed as u64 },
        (Err(_), error) => {
            drove_launch::RankOutcome::Failed { steps: 0, error: error.as_deref().unwrap_or("") }
        }
    };
    if let Some(delivery) = launched.finish(outcome)
        && delivery.undelivered() > 0
    {
        tracing::warn!("rank {rank}: {delivery}");
    }
    let report = result?;
    if rank == 0 {
        print(&report, args.json, || serde_json::to_string_pretty(&report).expect("json") + "\n")?;
    }
    Ok(())
}

/// `drove bench nccl`: at the world size of the launcher it runs under (1
/// alone); with `--buckets`, the in-place checks instead.
pub fn nccl(args: &NcclArgs) -> anyhow::Result<ExitCode> {
    #[cfg(feature = "nccl")]
    {
        let launched = drove_launch::Launched::join()?;
        let mesh = launched.comm();
        let (report, passed) = if args.buckets {
            let report = drove_bench::nccl::in_place(&args.options, mesh)?;
            let passed = report.passed;
            (serde_json::to_value(report).context("json")?, passed)
        } else {
            (serde_json::to_value(drove_bench::nccl::run(&args.options, mesh)?).context("json")?, true)
        };
        launched.finish(drove_launch::RankOutcome::Finished { steps: 1 });
        print(&report, args.json, || serde_json::to_string_pretty(&report).expect("json") + "\n")?;
        Ok(if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = args;
        anyhow::bail!("drove bench nccl: {}", drove_ner::BUILD_HINT)
    }
}

/// `drove bench matmul`: cubek's matmul kernels (and cuBLAS on CUDA) on the
/// GEMMs of a MiniLM step; a kernel whose product is off the reference is a
/// row with `matched: false`, not a failure of the command.
pub fn matmul(args: &MatmulArgs) -> anyhow::Result<()> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        let report = drove_bench::matmul::run(&args.options, args.device)?;
        print(&report, args.json, || serde_json::to_string_pretty(&report).expect("json") + "\n")
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = args;
        anyhow::bail!("drove bench matmul: {}", drove_ner::BUILD_HINT)
    }
}

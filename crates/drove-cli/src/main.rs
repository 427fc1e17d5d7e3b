//! `drove`: the command line of the drove toolkit.
//!
//! drove exists so that the ranks and loader workers of a data-parallel run never
//! share a random stream (the multi-GPU masking bug: every worker of every rank
//! seeded alike, so every rank masks its shard identically). This binary is how a
//! user checks and measures that:
//!
//! - `drove diag masks` simulates a run (ranks x loader workers over a synthetic
//!   dataset) under a chosen seeding and reports how often different ranks' masks
//!   agree: `p^2 + (1-p)^2` for independent masks, 1.0 under the bug.
//! - `drove bench mask` measures the masker, collation and the loader pool in
//!   tokens per second, next to copy and RNG baselines from the same run.
//! - `drove bench allreduce` spawns N local ranks and measures all-reduce and
//!   broadcast bandwidth per message size, beside a memory-copy baseline.
//! - `drove train ner` fine-tunes a BERT for named-entity recognition on
//!   CoNLL-2003, alone or as one rank under `drove run`, with `--diagnose-every`
//!   comparing the ranks' masks and gradients; `drove bench train` measures its
//!   throughput.
//! - `drove seed` prints a stream key, its derived seed and the first outputs of
//!   its stream, and replays a logged derived seed.
//! - `drove coordinator` serves the control plane (rendezvous, weights, metrics);
//!   `drove run --np N -- PROGRAM` launches N ranks of a program on this host
//!   with a coordinator (in-process unless one is given), relaying their output
//!   and stopping them all when one fails; `drove check` is a program to run
//!   under it; `drove metrics` and `drove runs` query a coordinator;
//!   `drove report` draws a run's charts into an HTML page;
//!   `drove bench coordinator` measures one.
//!
//! Results go to stdout (one JSON object with `--json`); logs go to stderr,
//! filtered by `RUST_LOG` (default `warn`).

mod bench;
mod check;
mod check_payload;
mod control;
mod diag;
mod fault;
mod launch;
mod parse;
mod report;
mod seed;
mod train;
mod weights;

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Data-parallel training toolkit whose ranks and loader workers never share a
/// random stream.
#[derive(Debug, Parser)]
#[command(name = "drove", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Training: `drove train ner` fine-tunes a BERT for NER (alone or under `drove run`).
    Train {
        #[command(subcommand)]
        what: TrainCommand,
    },
    /// Diagnostics of a data-parallel run.
    Diag {
        #[command(subcommand)]
        what: DiagCommand,
    },
    /// Throughput measurements.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Print a stream key, its derived seed and its first outputs, or replay a
    /// derived seed.
    Seed(seed::SeedArgs),
    /// Serve the control plane (rendezvous, weights, metrics) until SIGINT or SIGTERM.
    Coordinator(drove_coordinator::Flags),
    /// Launch N ranks of a program on this host: `drove run --np 4 -- PROGRAM ARGS...`.
    ///
    /// Each rank gets drove's variables (DROVE_RANK, DROVE_WORLD_SIZE, DROVE_COORDINATOR, ...)
    /// and, in a fixed world, torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
    /// MASTER_ADDR, MASTER_PORT on a free port), so `torch.distributed.init_process_group`
    /// works unchanged under `drove run --np 4 -- python3 train.py`.
    Run(launch::RunArgs),
    /// Join the other ranks, all-reduce the rank numbers and print the sum (run it
    /// under `drove run`).
    Check(check::CheckArgs),
    /// Query a run's metric points (aggregated across ranks, or raw), or watch them.
    Metrics(control::MetricsArgs),
    /// List the runs a coordinator knows.
    Runs(control::RunsArgs),
    /// Write a run's charts (PNG and SVG) and one HTML page with its header
    /// and diversity verdict, from a coordinator or its store; during the run
    /// or after it.
    Report(report::ReportArgs),
    /// Ask a coordinator whether it is serving (gRPC health; exits 0 only on
    /// SERVING): for container health checks.
    Health(control::HealthArgs),
    /// Rewrite a safetensors file's float tensors as f16 or f32 (to carry
    /// weights in half the bytes, and back).
    Weights(weights::WeightsArgs),
}

#[derive(Debug, Subcommand)]
enum TrainCommand {
    /// Fine-tune a BERT token classifier on CoNLL-format NER data.
    Ner(Box<train::NerArgs>),
}

#[derive(Debug, Subcommand)]
enum DiagCommand {
    /// Cross-rank mask agreement of a simulated run (detects ranks that mask alike).
    Masks(diag::MasksArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Masking, collation and loader throughput in padded tokens per second.
    Mask(bench::MaskArgs),
    /// All-reduce and broadcast bandwidth across N local rank processes.
    Allreduce(bench::AllreduceArgs),
    /// One rank of `bench allreduce` (started by it).
    #[command(hide = true)]
    AllreduceWorker(drove_bench::allreduce::WorkerOptions),
    /// A coordinator's rendezvous latency, metric ingest rate and blob bandwidth.
    Coordinator(bench::CoordinatorArgs),
    /// Training throughput (sentences/s, tokens/s) and peak memory at 1 rank.
    Train(bench::TrainArgs),
    /// One rank of a training run across the ranks it was launched with
    /// (`drove run --np N`, or bench/scaling.sh's namespaces): each step's
    /// compute, exposed communication and optimizer time.
    Scaling(bench::ScalingArgs),
    /// NCCL all-reduce bandwidth beside a device-to-device copy, at the world
    /// size of the launcher it runs under (`drove run --np 2`: two ranks,
    /// on one GPU with --gpu 0 where NCCL allows it); --buckets checks the
    /// in-place path on burn tensors instead (built with feature `nccl`).
    Nccl(bench::NcclArgs),
    /// cubek's matmul kernels timed on the GEMMs of a MiniLM step, each
    /// result checked, beside cuBLAS on CUDA (built with `cuda` or `wgpu`).
    Matmul(bench::MatmulArgs),
}

/// Logs to stderr, filtered by `RUST_LOG`, else by `default` with the Vulkan
/// loader's and driver's own messages (wgpu-hal's) off: when they matter the
/// device's error says what they say (`RUST_LOG=wgpu_hal=warn` shows them).
fn init_tracing(default: &str) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{default},wgpu_hal=off")));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .finish();
    let _ = tracing::subscriber::set_global_default(subscriber);
    // The `log` records of the crates that use it (wgpu, cubecl) go to
    // `tracing`, except cubecl's kernel-launch notes, which are counted.
    if drove_ner::kernels::install_logger(|record| {
        let _ = tracing_log::format_trace(record);
    })
    .is_ok()
    {
        use tracing_log::AsLog as _;
        let level = tracing::level_filters::LevelFilter::current().as_log();
        log::set_max_level(level.max(log::LevelFilter::Info));
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cli.command {
        Command::Train { what: TrainCommand::Ner(args) } => train::ner(&args),
        Command::Diag { what: DiagCommand::Masks(args) } => done(diag::run(&args)),
        Command::Bench { what: BenchCommand::Mask(args) } => done(bench::mask(&args)),
        Command::Bench { what: BenchCommand::Allreduce(args) } => done(bench::allreduce(&args)),
        Command::Bench { what: BenchCommand::AllreduceWorker(args) } => done(bench::allreduce_worker(&args)),
        Command::Bench { what: BenchCommand::Coordinator(args) } => done(bench::coordinator(&args)),
        Command::Bench { what: BenchCommand::Train(args) } => done(bench::train(&args)),
        Command::Bench { what: BenchCommand::Scaling(args) } => done(bench::scaling(&args)),
        Command::Bench { what: BenchCommand::Nccl(args) } => bench::nccl(&args),
        Command::Bench { what: BenchCommand::Matmul(args) } => done(bench::matmul(&args)),
        Command::Weights(args) => done(weights::weights(&args)),
        Command::Seed(args) => done(seed::run(&args)),
        Command::Coordinator(flags) => done(control::serve(&flags)),
        Command::Run(args) => launch::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Metrics(args) => done(control::metrics(&args)),
        Command::Runs(args) => done(control::runs(&args)),
        Command::Report(args) => done(report::run(&args)),
        Command::Health(args) => done(control::health(&args)),
    }
}

/// Keeps freed memory in the process instead of handing it back to the kernel.
///
/// A training step allocates and frees the same large buffers every time (the
/// 47 MB embedding gradient and its update among them). glibc serves blocks
/// over 32 MB with fresh `mmap`s and trims the heap after each free, so every
/// step faulted its pages in again: a tenth of a step went to page faults.
/// An explicit `MALLOC_*` setting in the environment wins.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let set = |var: &str| std::env::var_os(var).is_some();
        // SAFETY: mallopt only changes allocator parameters; called before any
        // other thread exists.
        unsafe {
            if !set("MALLOC_MMAP_THRESHOLD_") {
                libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
            }
            if !set("MALLOC_TRIM_THRESHOLD_") {
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
            if !set("MALLOC_TOP_PAD_") {
                libc::mallopt(libc::M_TOP_PAD, 256 << 20);
            }
        }
    }
}

/// `e` and its causes on one line, each said once: a cause whose words the
/// line already ends with (an error whose message includes its source, as
/// thiserror's `"...: {0}"` with `#[from]` does) is not said again.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.ends_with(&cause) {
            line = format!("{line}: {cause}");
        }
    }
    line
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    // The coordinator logs its calls, and `drove run` what it does with the ranks.
    init_tracing(match cli.command {
        Command::Coordinator(_) => "info",
        Command::Run(_) => "warn,drove_launch=info,drove_coordinator=error",
        _ => "warn",
    });
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line with the whole chain of causes, in clap's style.
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn probability_parser_rejects_values_outside_the_unit_interval() {
        assert_eq!(parse::probability("0.15"), Ok(0.15));
        assert_eq!(parse::probability("0"), Ok(0.0));
        assert_eq!(parse::probability("1"), Ok(1.0));
        for bad in ["1.5", "-0.1", "NaN", "inf", "abc"] {
            let err = parse::probability(bad).unwrap_err();
            assert!(err.contains("probability"), "{bad}: {err}");
        }
    }

    /// An error whose message ends with its source's, as thiserror's
    /// `#[error("...: {0}")]` with `#[from]` writes it.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "joining the other ranks: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_line_says_each_cause_once() {
        let inner = std::io::Error::other("the file lists 3");
        let e = anyhow::Error::from(Wrapping(inner)).context("drove check");
        assert_eq!(one_line(&e), "drove check: joining the other ranks: the file lists 3");
        let e =
            anyhow::Error::from(std::io::Error::other("refused")).context("connecting").context("joining");
        assert_eq!(one_line(&e), "joining: connecting: refused");
    }

    #[test]
    fn seconds_parser_rejects_negative_and_infinite_values() {
        assert_eq!(parse::seconds("0.05"), Ok(0.05));
        for bad in ["-1", "inf", "NaN", "x"] {
            assert!(parse::seconds(bad).unwrap_err().contains("seconds"), "{bad}");
        }
    }
}

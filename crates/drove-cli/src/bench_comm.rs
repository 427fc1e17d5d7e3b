//! `drove bench allreduce`: spawns N local rank processes and measures all-reduce
//! and broadcast per message size: median time per op (after warm-up), algbw =
//! bytes / time and busbw = algbw * 2(N-1)/N (broadcast: busbw = algbw), next to
//! a memory-copy baseline of the same size measured in the same run.

use std::io::IsTerminal as _;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use drove_comm::{Collective, Communicator, Element, ReduceOp, ReduceOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::bench::Machine;

/// Settings of `drove bench allreduce`.
#[derive(Debug, Args)]
pub struct AllreduceArgs {
    /// Number of rank processes.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = np)]
    np: usize,
    /// Message sizes, comma-separated, with B, KiB, MiB or GiB.
    #[arg(long, default_value = "1KiB,1MiB,16MiB,64MiB,256MiB", value_name = "LIST", value_parser = sizes)]
    sizes: Sizes,
    /// Reduce op of the all-reduce.
    #[arg(long, default_value = "sum", value_name = "sum|average|min|max|product")]
    op: ReduceOp,
    /// Transport: auto (shared memory on one host), tcp (the ring) or
    /// hierarchical (as auto; fails if shared memory cannot be set up).
    #[arg(long, default_value = "auto", value_name = "auto|tcp|hierarchical")]
    transport: drove_comm::Transport,
    /// Timed iterations per size and op, at least (more for small sizes, up to ~0.5 s each).
    #[arg(long, default_value_t = 10, value_name = "N", value_parser = iters)]
    iters: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The hidden subcommand each rank process runs.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long, value_parser = sizes)]
    sizes: Sizes,
    #[arg(long)]
    op: ReduceOp,
    #[arg(long)]
    iters: usize,
    /// Profile the TCP ring's steps during the timed all-reduces (rank 0's
    /// view, per op: time in send, receive, the reduction and waiting, and
    /// the bytes in flight).
    #[arg(long)]
    profile: bool,
}

/// A list of byte sizes.
#[derive(Clone, Debug)]
pub struct Sizes(Vec<usize>);

fn np(s: &str) -> Result<usize, String> {
    crate::parse::at_least(s, 1, "np", " rank")
}

fn iters(s: &str) -> Result<usize, String> {
    crate::parse::at_least(s, 10, "iters", " (medians of fewer are noise)")
}

/// Parses `1KiB,64MiB,...`.
fn sizes(s: &str) -> Result<Sizes, String> {
    s.split(',').map(crate::parse::bytes).collect::<Result<Vec<_>, _>>().map(Sizes)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

/// One size's figures.
#[derive(Debug, Serialize, Deserialize)]
struct Row {
    collective: String,
    bytes: usize,
    size: String,
    iterations: usize,
    median_us: f64,
    algbw_gbps: f64,
    busbw_gbps: f64,
    memcpy_gbps: f64,
    busbw_vs_memcpy: f64,
    /// With `--profile`: each ring step, per op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    profile: Option<Vec<StepRow>>,
}

/// One ring step of a profiled all-reduce, per op (microseconds, bytes).
#[derive(Debug, Serialize, Deserialize)]
struct StepRow {
    phase: String,
    step: usize,
    total_us: f64,
    send_us: f64,
    recv_us: f64,
    reduce_us: f64,
    wait_us: f64,
    other_us: f64,
    bytes: u64,
    mean_unsent: f64,
    max_unsent: u64,
}

impl StepRow {
    fn per_op(s: &drove_comm::RingStep) -> StepRow {
        let ops = s.ops.max(1) as f64;
        let us = |d: std::time::Duration| d.as_secs_f64() * 1e6 / ops;
        StepRow {
            phase: s.phase.to_string(),
            step: s.step,
            total_us: us(s.total),
            send_us: us(s.send),
            recv_us: us(s.recv),
            reduce_us: us(s.reduce),
            wait_us: us(s.wait),
            other_us: us(s.other()),
            bytes: s.bytes / s.ops.max(1),
            mean_unsent: s.mean_unsent(),
            max_unsent: s.max_unsent,
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    np: usize,
    op: String,
    transport: String,
    machine: Machine,
    results: Vec<Row>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn memcpy_seconds(bytes: usize, iterations: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src); // fault the pages in
    let times = (0..iterations)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(times)
}

/// Runs inside each rank process; rank 0 prints one JSON row per line.
pub fn worker(args: &WorkerArgs) -> anyhow::Result<()> {
    let comm = Communicator::from_env().context("connecting to the other ranks")?;
    let (rank, n) = (comm.rank(), comm.world_size());
    for &bytes in &args.sizes.0 {
        let len = bytes / 4;
        for collective in ["allreduce", "broadcast"] {
            let mut data = vec![(rank + 1) as f32; len];
            let op = |data: &mut [f32]| -> anyhow::Result<()> {
                if collective == "allreduce" {
                    comm.all_reduce("bench", &[len], f32::tensor_mut(data), ReduceOptions::new(args.op))?;
                } else {
                    comm.broadcast("bench", &[len], f32::tensor_mut(data), 0)?;
                }
                Ok(())
            };
            // Warm-up, checking the result once.
            op(&mut data)?;
            let want = if collective == "allreduce" && args.op == ReduceOp::Sum {
                (n * (n + 1) / 2) as f32
            } else {
                1.0
            };
            if (collective == "broadcast" || args.op == ReduceOp::Sum)
                && (data[0] != want || data[len - 1] != want)
            {
                bail!(
                    "{collective} of {bytes} bytes gave {} and {}, expected {want}",
                    data[0],
                    data[len - 1]
                );
            }
            let t = Instant::now();
            op(&mut data)?;
            op(&mut data)?;
            let warm = t.elapsed().as_secs_f64() / 2.0;
            // Every rank computes the same count from rank 0's warm-up time.
            let mut count = [((0.5 / warm.max(1e-9)) as i64).clamp(args.iters as i64, 2000)];
            comm.broadcast("bench.count", &[1], i64::tensor_mut(&mut count), 0)?;
            let iterations = count[0] as usize;
            let mut times = Vec::with_capacity(iterations);
            let profiled = args.profile && collective == "allreduce";
            comm.set_ring_profile(profiled);
            for _ in 0..iterations {
                comm.barrier("bench.sync")?;
                let t = Instant::now();
                op(&mut data)?;
                times.push(t.elapsed().as_secs_f64());
            }
            let steps = comm.take_ring_profile();
            comm.set_ring_profile(false);
            let profile = profiled.then(|| steps.iter().map(StepRow::per_op).collect());
            if rank == 0 {
                let secs = median(times);
                let algbw = bytes as f64 / secs / 1e9;
                let busbw =
                    if collective == "allreduce" { algbw * 2.0 * (n - 1) as f64 / n as f64 } else { algbw };
                let memcpy = bytes as f64 / memcpy_seconds(bytes, iterations.min(50)) / 1e9;
                let row = Row {
                    collective: collective.into(),
                    bytes,
                    size: human(bytes),
                    iterations,
                    median_us: secs * 1e6,
                    algbw_gbps: algbw,
                    busbw_gbps: busbw,
                    memcpy_gbps: memcpy,
                    busbw_vs_memcpy: busbw / memcpy,
                    profile,
                };
                println!("{}", serde_json::to_string(&row)?);
            }
        }
    }
    Ok(())
}

/// Spawns the ranks and reports rank 0's figures.
pub fn run(args: &AllreduceArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating the drove executable")?;
    let dir = std::env::temp_dir().join(format!(
        "drove-bench-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let sizes: Vec<String> = args.sizes.0.iter().map(|b| format!("{b}B")).collect();
    let spinner = if std::io::stderr().is_terminal() {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden())
    };
    spinner.set_style(ProgressStyle::with_template("{spinner} {msg} {elapsed}").expect("valid template"));
    spinner.set_message(format!("{} ranks, {} sizes", args.np, sizes.len()));
    spinner.enable_steady_tick(Duration::from_millis(100));
    let children = spawn_ranks(args, &exe, &dir, &sizes)?;
    let (rank0, failed) = wait_for_ranks(children)?;
    spinner.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(f) = failed {
        bail!("{f}");
    }
    let stdout = String::from_utf8(rank0.unwrap_or_default()).context("rank 0's output is not UTF-8")?;
    let results = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<Row>, _>>()
        .context("parsing rank 0's results")?;
    let report = Report {
        np: args.np,
        op: args.op.to_string(),
        transport: args.transport.to_string(),
        machine: Machine::detect(),
        results,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

/// Starts the `args.np` rank processes of `exe`, meeting in `dir`, rank 0's
/// output piped.
fn spawn_ranks(
    args: &AllreduceArgs,
    exe: &std::path::Path,
    dir: &std::path::Path,
    sizes: &[String],
) -> anyhow::Result<Vec<Child>> {
    let mut children = Vec::with_capacity(args.np);
    for rank in 0..args.np {
        let child = Command::new(exe)
            .args([
                "bench",
                "allreduce-worker",
                "--sizes",
                &sizes.join(","),
                "--op",
                &args.op.to_string(),
                "--iters",
                &args.iters.to_string(),
            ])
            .env("DROVE_RANK", rank.to_string())
            .env("DROVE_WORLD_SIZE", args.np.to_string())
            .env("DROVE_RENDEZVOUS_DIR", dir)
            .env("DROVE_COMM_TRANSPORT", args.transport.as_str())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting rank {rank}"))?;
        children.push(child);
    }
    Ok(children)
}

/// Waits (at most 10 minutes, then kills them all) for every rank; returns
/// rank 0's output and the first failure seen, if any.
fn wait_for_ranks(children: Vec<Child>) -> anyhow::Result<(Option<Vec<u8>>, Option<String>)> {
    let np = children.len();
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let (tx, rx) = mpsc::channel();
    for (rank, child) in children.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((rank, child.wait_with_output()));
        });
    }
    drop(tx);
    let limit = Duration::from_secs(600);
    let start = Instant::now();
    let mut rank0 = None;
    let mut failed = None;
    for _ in 0..np {
        match rx.recv_timeout(limit.saturating_sub(start.elapsed())) {
            Ok((rank, out)) => {
                let out = out.with_context(|| format!("waiting for rank {rank}"))?;
                if !out.status.success() && failed.is_none() {
                    failed = Some(format!("rank {rank} exited with {}", out.status));
                }
                if rank == 0 {
                    rank0 = Some(out.stdout);
                }
            }
            Err(_) => {
                for pid in &pids {
                    // SAFETY: signalling our own children.
                    unsafe {
                        libc::kill(*pid as i32, libc::SIGKILL);
                    }
                }
                bail!("the ranks did not finish within {limit:?}");
            }
        }
    }
    Ok((rank0, failed))
}

/// The report as a table, one row per collective and size.
fn print_table(report: &Report) {
    println!("{} ranks, op {}, transport {}", report.np, report.op, report.transport);
    println!(
        "{:<10} {:>8} {:>6} {:>12} {:>10} {:>10} {:>10}",
        "collective", "size", "iters", "median us", "algbw GB/s", "busbw GB/s", "memcpy GB/s"
    );
    for r in &report.results {
        println!(
            "{:<10} {:>8} {:>6} {:>12.1} {:>10.3} {:>10.3} {:>10.3}",
            r.collective, r.size, r.iterations, r.median_us, r.algbw_gbps, r.busbw_gbps, r.memcpy_gbps
        );
    }
}

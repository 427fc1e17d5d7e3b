//! The all-reduce suite: N local rank processes measure all-reduce and
//! broadcast per message size: median time per op (after warm-up), algbw =
//! bytes / time and busbw = algbw * 2(N-1)/N (broadcast: busbw = algbw), next
//! to a memory-copy baseline of the same size measured in the same run.
//!
//! Two halves: [`run`] starts the ranks (a [`WorkerCommand`]: any program
//! that calls [`worker`] with the [`WorkerOptions`] its flags give; `drove
//! bench allreduce` starts `drove bench allreduce-worker`) and gathers rank
//! 0's rows; [`worker`] is one rank, joining the others through the
//! environment `run` sets.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use drove_collective::{Collective, Element, ReduceOp, ReduceOptions};
use drove_comm::{Communicator, Transport};
use drove_launch::var;
use serde::{Deserialize, Serialize};

use crate::error::Doing as _;
use crate::measure::{median, spinner};
use crate::{BenchError, Machine, Sizes, human};

/// Settings of the all-reduce suite (`drove bench allreduce`).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct AllreduceOptions {
    /// Number of rank processes.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2, value_name = "N", value_parser = parse::np))]
    pub np: usize,
    /// Message sizes, comma-separated, with B, KiB, MiB or GiB.
    #[cfg_attr(feature = "clap", arg(long, default_value = "1KiB,1MiB,16MiB,64MiB,256MiB", value_name = "LIST",
        value_parser = parse::sizes))]
    pub sizes: Sizes,
    /// Reduce op of the all-reduce.
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value = "sum", value_name = "sum|average|min|max|product")
    )]
    pub op: ReduceOp,
    /// Transport: auto (shared memory on one host), tcp (the ring) or
    /// hierarchical (as auto; fails if shared memory cannot be set up).
    #[cfg_attr(feature = "clap", arg(long, default_value = "auto", value_name = "auto|tcp|hierarchical"))]
    pub transport: Transport,
    /// Timed iterations per size and op, at least (more for small sizes, up to ~0.5 s each).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 10, value_name = "N", value_parser = parse::iters))]
    pub iters: usize,
    /// A spinner on stderr while the ranks run, when stderr is a terminal (no
    /// flag; on by default).
    #[cfg_attr(feature = "clap", arg(skip = true))]
    pub progress: bool,
}

impl Default for AllreduceOptions {
    fn default() -> Self {
        AllreduceOptions {
            np: 2,
            sizes: Sizes(vec![1 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]),
            op: ReduceOp::Sum,
            transport: Transport::Auto,
            iters: 10,
            progress: true,
        }
    }
}

/// What each rank process is given (`drove bench allreduce-worker`'s flags).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct WorkerOptions {
    /// Message sizes.
    #[cfg_attr(feature = "clap", arg(long, value_parser = parse::sizes))]
    pub sizes: Sizes,
    /// Reduce op of the all-reduce.
    #[cfg_attr(feature = "clap", arg(long))]
    pub op: ReduceOp,
    /// Timed iterations per size and op, at least.
    #[cfg_attr(feature = "clap", arg(long))]
    pub iters: usize,
    /// Profile the TCP ring's steps during the timed all-reduces (rank 0's
    /// view, per op: time in send, receive, the reduction and waiting, and
    /// the bytes in flight).
    #[cfg_attr(feature = "clap", arg(long))]
    pub profile: bool,
}

#[cfg(feature = "clap")]
mod parse {
    use crate::Sizes;
    use crate::flags::at_least;

    pub fn np(s: &str) -> Result<usize, String> {
        at_least(s, 1, "np", " rank")
    }

    pub fn iters(s: &str) -> Result<usize, String> {
        at_least(s, 10, "iters", " (medians of fewer are noise)")
    }

    pub fn sizes(s: &str) -> Result<Sizes, String> {
        s.parse()
    }
}

/// The program each rank runs: `program`, then `args`, then the
/// [`WorkerOptions`] as flags (`--sizes 1024B,... --op sum --iters 10`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerCommand {
    /// The executable.
    pub program: PathBuf,
    /// Its leading arguments (`bench allreduce-worker` for `drove`).
    pub args: Vec<OsString>,
}

/// One size's figures, for one collective.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllreduceRow {
    /// `allreduce` or `broadcast`.
    pub collective: String,
    /// The message's bytes.
    pub bytes: usize,
    /// The same, as people read it (`64MiB`).
    pub size: String,
    /// Timed iterations.
    pub iterations: usize,
    /// Median microseconds per op.
    pub median_us: f64,
    /// Bytes over the median time, GB/s.
    pub algbw_gbps: f64,
    /// The bus bandwidth (nccl-tests' definition), GB/s.
    pub busbw_gbps: f64,
    /// A memory copy of the same size, GB/s.
    pub memcpy_gbps: f64,
    /// `busbw_gbps` over `memcpy_gbps`.
    pub busbw_vs_memcpy: f64,
    /// With [`WorkerOptions::profile`]: each ring step, per op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Vec<StepRow>>,
}

/// One ring step of a profiled all-reduce, per op (microseconds, bytes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // drove_comm::RingStep's fields, per op.
pub struct StepRow {
    pub phase: String,
    pub step: usize,
    pub total_us: f64,
    pub send_us: f64,
    pub recv_us: f64,
    pub reduce_us: f64,
    pub wait_us: f64,
    pub other_us: f64,
    pub bytes: u64,
    pub mean_unsent: f64,
    pub max_unsent: u64,
}

impl StepRow {
    fn per_op(s: &drove_comm::RingStep) -> StepRow {
        let ops = s.ops.max(1) as f64;
        let us = |d: Duration| d.as_secs_f64() * 1e6 / ops;
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

/// What the all-reduce suite reports (the JSON of `drove bench allreduce --json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AllreduceReport {
    /// Rank processes.
    pub np: usize,
    /// The all-reduce's op.
    pub op: String,
    /// The transport asked for.
    pub transport: String,
    /// Where it ran.
    pub machine: Machine,
    /// Rank 0's rows: per size, the all-reduce then the broadcast.
    pub results: Vec<AllreduceRow>,
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
    median(times).unwrap_or(f64::NAN)
}

/// One collective on `data`, as every rank calls it.
fn op(comm: &Communicator, collective: &str, reduce: ReduceOp, data: &mut [f32]) -> Result<(), BenchError> {
    let len = data.len();
    if collective == "allreduce" {
        comm.all_reduce("bench", &[len], f32::tensor_mut(data), ReduceOptions::new(reduce))?;
    } else {
        comm.broadcast("bench", &[len], f32::tensor_mut(data), 0)?;
    }
    Ok(())
}

/// The warm-up: one op whose result is checked, then two timed to pick the
/// iteration count (rank 0's, broadcast so every rank makes as many).
fn warm_up(
    comm: &Communicator,
    o: &WorkerOptions,
    collective: &str,
    bytes: usize,
    data: &mut [f32],
) -> Result<usize, BenchError> {
    let (len, n) = (data.len(), comm.world_size());
    op(comm, collective, o.op, data)?;
    let want =
        if collective == "allreduce" && o.op == ReduceOp::Sum { (n * (n + 1) / 2) as f32 } else { 1.0 };
    if (collective == "broadcast" || o.op == ReduceOp::Sum) && (data[0] != want || data[len - 1] != want) {
        return Err(BenchError::Check(format!(
            "{collective} of {bytes} bytes gave {} and {}, expected {want}",
            data[0],
            data[len - 1]
        )));
    }
    let t = Instant::now();
    op(comm, collective, o.op, data)?;
    op(comm, collective, o.op, data)?;
    let warm = t.elapsed().as_secs_f64() / 2.0;
    // Every rank computes the same count from rank 0's warm-up time.
    let mut count = [((0.5 / warm.max(1e-9)) as i64).clamp(o.iters as i64, 2000)];
    comm.broadcast("bench.count", &[1], i64::tensor_mut(&mut count), 0)?;
    Ok(count[0] as usize)
}

/// Rank 0's figures of one collective from its timed iterations.
fn row(
    collective: &str,
    bytes: usize,
    n: usize,
    times: Vec<f64>,
    profile: Option<Vec<StepRow>>,
) -> AllreduceRow {
    let iterations = times.len();
    let secs = median(times).unwrap_or(f64::NAN);
    let algbw = bytes as f64 / secs / 1e9;
    let busbw = if collective == "allreduce" { algbw * 2.0 * (n - 1) as f64 / n as f64 } else { algbw };
    let memcpy = bytes as f64 / memcpy_seconds(bytes, iterations.min(50)) / 1e9;
    AllreduceRow {
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
    }
}

/// One rank of the suite: joins the others (`drove_launch::connect_from_env`: the
/// variables [`run`] sets), times every size of both collectives, and returns
/// rank 0's rows (none on the other ranks). `drove bench allreduce-worker`
/// prints each as a JSON line, which [`run`] reads back.
pub fn worker(o: &WorkerOptions) -> Result<Vec<AllreduceRow>, BenchError> {
    let comm = drove_launch::connect_from_env().doing("connecting to the other ranks")?;
    let (rank, n) = (comm.rank(), comm.world_size());
    let mut rows = Vec::new();
    for &bytes in &o.sizes.0 {
        for collective in ["allreduce", "broadcast"] {
            let mut data = vec![(rank + 1) as f32; bytes / 4];
            let iterations = warm_up(&comm, o, collective, bytes, &mut data)?;
            let mut times = Vec::with_capacity(iterations);
            let profiled = o.profile && collective == "allreduce";
            comm.set_ring_profile(profiled);
            for _ in 0..iterations {
                comm.barrier("bench.sync")?;
                let t = Instant::now();
                op(&comm, collective, o.op, &mut data)?;
                times.push(t.elapsed().as_secs_f64());
            }
            let steps = comm.take_ring_profile();
            comm.set_ring_profile(false);
            let profile = profiled.then(|| steps.iter().map(StepRow::per_op).collect());
            if rank == 0 {
                rows.push(row(collective, bytes, n, times, profile));
            }
        }
    }
    Ok(rows)
}

/// Starts `o.np` ranks of `command`, waits for them, and reports rank 0's
/// rows (read from its stdout, one JSON row a line).
pub fn run(o: &AllreduceOptions, command: &WorkerCommand) -> Result<AllreduceReport, BenchError> {
    let dir = std::env::temp_dir().join(format!(
        "drove-bench-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).doing_with(|| format!("creating {}", dir.display()))?;
    let sizes: Vec<String> = o.sizes.0.iter().map(|b| format!("{b}B")).collect();
    let spinner = spinner(o.progress);
    spinner.set_message(format!("{} ranks, {} sizes", o.np, sizes.len()));
    let children = spawn_ranks(o, command, &dir, &sizes)?;
    let (rank0, failed) = wait_for_ranks(children)?;
    spinner.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(f) = failed {
        return Err(BenchError::Check(f));
    }
    let stdout = String::from_utf8(rank0.unwrap_or_default()).doing("rank 0's output is not UTF-8")?;
    let results = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<AllreduceRow>, _>>()
        .doing("parsing rank 0's results")?;
    Ok(AllreduceReport {
        np: o.np,
        op: o.op.to_string(),
        transport: o.transport.to_string(),
        machine: Machine::detect(),
        results,
    })
}

/// Starts the `o.np` rank processes of `command`, meeting in `dir`, rank 0's
/// output piped.
fn spawn_ranks(
    o: &AllreduceOptions,
    command: &WorkerCommand,
    dir: &Path,
    sizes: &[String],
) -> Result<Vec<Child>, BenchError> {
    let mut children = Vec::with_capacity(o.np);
    for rank in 0..o.np {
        let child = Command::new(&command.program)
            .args(&command.args)
            .args(["--sizes", &sizes.join(","), "--op", &o.op.to_string(), "--iters", &o.iters.to_string()])
            .env(var::RANK, rank.to_string())
            .env(var::WORLD_SIZE, o.np.to_string())
            .env(var::RENDEZVOUS_DIR, dir)
            .env(var::COMM_TRANSPORT, o.transport.as_str())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .doing_with(|| format!("starting rank {rank}"))?;
        children.push(child);
    }
    Ok(children)
}

/// Waits (at most 10 minutes, then kills them all) for every rank; returns
/// rank 0's output and the first failure seen, if any.
fn wait_for_ranks(children: Vec<Child>) -> Result<(Option<Vec<u8>>, Option<String>), BenchError> {
    let np = children.len();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
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
        let Ok((rank, out)) = rx.recv_timeout(limit.saturating_sub(start.elapsed())) else {
            for pid in &pids {
                // SAFETY: signalling our own children.
                unsafe {
                    libc::kill(*pid as i32, libc::SIGKILL);
                }
            }
            return Err(BenchError::Check(format!("the ranks did not finish within {limit:?}")));
        };
        let out = out.doing_with(|| format!("waiting for rank {rank}"))?;
        if !out.status.success() && failed.is_none() {
            failed = Some(format!("rank {rank} exited with {}", out.status));
        }
        if rank == 0 {
            rank0 = Some(out.stdout);
        }
    }
    Ok((rank0, failed))
}

/// The report as a table, one row per collective and size.
impl fmt::Display for AllreduceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} ranks, op {}, transport {}", self.np, self.op, self.transport)?;
        writeln!(
            f,
            "{:<10} {:>8} {:>6} {:>12} {:>10} {:>10} {:>10}",
            "collective", "size", "iters", "median us", "algbw GB/s", "busbw GB/s", "memcpy GB/s"
        )?;
        for r in &self.results {
            writeln!(
                f,
                "{:<10} {:>8} {:>6} {:>12.1} {:>10.3} {:>10.3} {:>10.3}",
                r.collective, r.size, r.iterations, r.median_us, r.algbw_gbps, r.busbw_gbps, r.memcpy_gbps
            )?;
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "clap"))]
mod tests {
    use super::*;

    #[test]
    fn no_flags_are_the_default_options() {
        assert_eq!(crate::flags::parsed_from_no_flags::<AllreduceOptions>(), AllreduceOptions::default());
    }
}

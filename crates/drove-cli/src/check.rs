//! `drove check`: a small program to run under a launcher (`drove run --np 4 --
//! drove check`, `mpirun`, `srun`, torchrun-style variables). Each rank joins
//! the others the way a trainer does (`drove_launch::Launched`: rank 0
//! serves the coordinator where the launcher names a place for it),
//! all-reduces its rank, and prints `rank R of N: sum of ranks = S`; with
//! `--json`, also which launcher placed it, where the coordinator came from,
//! and the run id. With `--size SIZE` it also all-reduces tensors of that size
//! whose sums have a closed form and checks every element, `--iterations`
//! times (`check_payload.rs`), reporting the transport that carried them.
//!
//! `--fail-with CODE --rank-to-fail R` makes rank R fail the way a rank that
//! crashes during start-up does: with a coordinator (`DROVE_COORDINATOR`), it
//! joins the run, advertising an address where nothing listens, and exits with
//! CODE once the rendezvous is complete; without one, it exits before joining.
//! Either way the other ranks wait to connect to it (up to the 60 s connect
//! timeout) until the launcher stops them: a test of the launcher's failure
//! handling. Joining first means the coordinator knows the run, so the launcher
//! can mark it failed.

use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use drove_collective::{Element, ReduceOptions};
use drove_comm::Rendezvous;
use drove_launch::RankOutcome;
use serde_json::json;

/// Settings of `drove check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print one JSON object instead of a line.
    #[arg(long)]
    json: bool,
    /// Make rank --rank-to-fail exit with this code during start-up, after the
    /// rendezvous and before connecting (the others then wait for it until the
    /// launcher stops them).
    #[arg(long, value_name = "CODE", value_parser = clap::value_parser!(u8).range(1..))]
    fail_with: Option<u8>,
    /// The rank that fails with --fail-with.
    #[arg(long, value_name = "R", default_value_t = 0, requires = "fail_with")]
    rank_to_fail: usize,
    /// First print `pid PID` (lets a test check that no rank outlives its launcher).
    #[arg(long)]
    print_pid: bool,
    /// Also all-reduce an i64 and an f32 tensor of this size (B, KiB, MiB,
    /// GiB) and check every element: integers exact, floats within the
    /// reordering bound.
    #[arg(long, value_name = "SIZE", value_parser = crate::parse::bytes)]
    size: Option<usize>,
    /// How many times to all-reduce and check the --size tensors; each
    /// checked one is reported on stderr.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "size",
          value_parser = clap::value_parser!(u32).range(1..))]
    iterations: u32,
}

fn fail(code: u8, rank: usize) -> ExitCode {
    eprintln!("rank {rank}: exiting with code {code} on purpose (--fail-with)");
    ExitCode::from(code)
}

/// Joins the run on the coordinator with an address where nothing listens, and
/// returns once every rank has joined.
fn join_without_listening() -> anyhow::Result<()> {
    let launch = drove_launch::LaunchEnv::from_env().context("reading the launch environment")?;
    let (Some(addr), Some(run_id), Some(request)) = (&launch.coordinator, &launch.run_id, launch.place)
    else {
        anyhow::bail!("--join-without-listening needs DROVE_COORDINATOR, DROVE_RUN_ID and DROVE_WORLD_SIZE");
    };
    let rendezvous =
        launch.rendezvous_at(addr, run_id, request).context("reading the coordinator settings")?;
    // A port that was free a moment ago and is closed now: the others' dials are refused.
    let probe = TcpListener::bind(SocketAddr::new(rendezvous.bind_addr().ip(), 0))
        .context("finding a free port to advertise")?;
    let closed = probe.local_addr().context("finding a free port to advertise")?;
    drop(probe);
    rendezvous.exchange(closed, Instant::now() + Duration::from_secs(60)).context("joining the run")?;
    Ok(())
}

/// Runs one rank of the check.
pub fn run(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    if args.print_pid {
        println!("pid {}", std::process::id());
    }
    // A launcher that assigns ranks says which this is before anyone joins.
    let launch = drove_launch::LaunchEnv::from_env()?;
    if let Some(code) = args.fail_with
        && launch.rank().map(drove_collective::Rank::get) == Some(args.rank_to_fail)
    {
        if launch.rendezvous == drove_launch::RendezvousKind::Coordinator {
            join_without_listening()?;
        }
        return Ok(fail(code, args.rank_to_fail));
    }
    let launched = drove_launch::Launched::from_launch_env(launch).context(
        "joining the other ranks (drove check runs under a launcher: drove run --np 2 -- drove check)",
    )?;
    let comm = launched.comm();
    let (rank, world, transport) = (comm.rank(), comm.world_size(), comm.transport());
    if let Some(code) = args.fail_with
        && rank == args.rank_to_fail
    {
        return Ok(fail(code, rank));
    }
    let mut sum = [rank as i64];
    let summed = comm
        .all_reduce("drove.check.ranks", &[1], i64::tensor_mut(&mut sum), ReduceOptions::sum())
        .context("all-reducing the ranks");
    let expected = (world * world.saturating_sub(1) / 2) as i64;
    let outcome = summed
        .and_then(|()| {
            if sum[0] == expected {
                Ok(())
            } else {
                Err(anyhow::anyhow!("the all-reduce of the ranks gave {}, expected {expected}", sum[0]))
            }
        })
        .and_then(|()| check_payloads(comm, args));
    let env = launched.env();
    let (launcher, coordinator, run_id) = (env.launcher, env.coordinator_source, env.run_id.clone());
    let error = outcome.as_ref().err().map(|e| format!("{e:#}"));
    launched.finish(match &error {
        None => RankOutcome::Finished { steps: 1 },
        Some(error) => RankOutcome::Failed { steps: 0, error },
    });
    let checked = outcome?;
    if args.json {
        let report = json!({
            "rank": rank,
            "world_size": world,
            "sum": sum[0],
            "transport": transport,
            "launcher": launcher.map(|l| l.as_str()),
            "coordinator": coordinator.map(|s| s.as_str()),
            "run_id": run_id,
            "size": args.size,
            "iterations": args.size.map(|_| args.iterations),
            "float_error_eps": checked.as_ref().map(|c| c.float_error_eps),
            "int_digest": checked.as_ref().map(|c| c.int_digest.clone()),
            "float_digest": checked.as_ref().map(|c| c.float_digest.clone()),
        });
        println!("{report}");
    } else {
        println!("rank {rank} of {world}: sum of ranks = {}", sum[0]);
        if let (Some(size), Some(c)) = (args.size, &checked) {
            println!(
                "rank {rank}: {size} bytes all-reduced {} time(s) over {transport}: integers exact, \
                 floats within {:.2} eps (bound {})",
                args.iterations,
                c.float_error_eps,
                world - 1
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// With `--size`: all-reduces and checks the closed-form tensors
/// `--iterations` times; the last check's figures (all equal, or one failed).
fn check_payloads(
    comm: &dyn drove_collective::Collective,
    args: &CheckArgs,
) -> anyhow::Result<Option<crate::check_payload::Checked>> {
    let Some(size) = args.size else { return Ok(None) };
    let rank = comm.rank();
    let mut last = None;
    let payload = || crate::check_payload::Payload::new(rank, size);
    let mut next = Some(payload());
    for k in 1..=args.iterations {
        let checked = next
            .take()
            .expect("built before its all-reduce")
            .all_reduce_and_check(comm)
            .with_context(|| format!("checking all-reduce {k} of {}", args.iterations))?;
        // Built before the line, so that the next op starts as it is written
        // (and not after the last).
        next = (k < args.iterations).then(payload);
        eprintln!("rank {rank}: all-reduce {k}/{} checked", args.iterations);
        last = Some(checked);
    }
    Ok(last)
}

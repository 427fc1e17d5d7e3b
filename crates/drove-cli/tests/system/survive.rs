//! A run that survives its coordinator, and one that names a hung rank: real
//! `drove-coordinator` processes on loopback, `drove run` with two ranks of
//! `drove train ner` on MiniLM and a slice of CoNLL-2003.
//!
//! - The coordinator is SIGKILLed mid-run and restarted 5 s later on the same
//!   store and port: the run exits 0, every (rank, step) `loss` point is in the
//!   store exactly once, and `drove runs` shows the run finished with its world.
//! - The coordinator killed for good: the run still exits 0, after the bounded
//!   flush wait, with a warning naming the points not delivered.
//! - A rank SIGSTOPped mid-run: `drove run` exits non-zero within the
//!   heartbeat timeout and the grace period, naming that rank; nothing is left.

use std::os::unix::process::ExitStatusExt as _;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{DROVE, Proc, assets, coordinator, free_port};

/// How long a whole run may take here.
const DEADLINE: Duration = Duration::from_secs(300);

/// `drove run --np 2` of a fine-tune long enough to outlive an outage.
fn training(addr: &str, run_id: &str, out: &std::path::Path, env: &[(&str, &str)]) -> Proc {
    let a = assets();
    let mut cmd = Command::new(DROVE);
    cmd.args(["run", "--np", "2", "--coordinator", addr, "--run-id", run_id, "--stop-grace-secs", "2", "--"])
        .arg(DROVE)
        .args(["train", "ner", "--max-train-sentences", "80", "--batch-size", "4", "--epochs", "6"])
        .args(["--eval", "", "--workers", "1", "--log-every", "1", "--dropout", "0", "--data"])
        .arg(a.join("conll2003"))
        .arg("--model")
        .arg(a.join("minilm"))
        .arg("--out")
        .arg(out)
        .env("RUST_LOG", "info");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn(&mut cmd)
}

/// Waits for rank 0's line `step N/`.
fn wait_for_step(run: &mut Proc, step: u64) {
    let want = format!("[0] step {step}/");
    assert!(run.stderr_until(DEADLINE, |l| l.starts_with(&want)), "no {want:?}:\n{}", run.err.join("\n"));
}

fn json(args: &[&str]) -> serde_json::Value {
    let (status, out, err) = Proc::drove(args).finish(Duration::from_secs(60));
    assert!(status.success(), "drove {args:?}: {err}");
    serde_json::from_str(&out.join("\n")).unwrap_or_else(|e| panic!("drove {args:?}: {e}: {out:?}"))
}

#[test]
fn a_coordinator_killed_and_restarted_mid_run_loses_and_fails_nothing() {
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let first = coordinator(port, store.path(), &[]);
    let mut run = training(&addr, "outage", out.path(), &[]);
    wait_for_step(&mut run, 3);
    first.signal(libc::SIGKILL);
    let (status, _, _) = first.finish(Duration::from_secs(30));
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    // The outage under test lasts 5 s (a duration of the scenario, not a wait for anything).
    std::thread::sleep(Duration::from_secs(5));
    let _second = coordinator(port, store.path(), &[]);
    // The restarted coordinator knows the run from its store, world and all.
    let runs = json(&["runs", "--coordinator", &addr, "--json"]);
    let resumed = runs["runs"].as_array().unwrap().iter().find(|r| r["run_id"] == "outage").expect("the run");
    assert_eq!((resumed["world_size"].as_u64(), resumed["joined"].as_u64()), (Some(2), Some(2)), "{resumed}");
    assert!(matches!(resumed["state"].as_str(), Some("running" | "finished")), "{resumed}");
    let (status, _, err) = run.finish(DEADLINE);
    assert!(status.success(), "the run failed across the outage: {err}");
    assert!(!err.contains("not delivered"), "every point was delivered in the end: {err}");

    let points = json(&[
        "metrics",
        "--coordinator",
        &addr,
        "--run",
        "outage",
        "--name",
        "loss",
        "--agg",
        "raw",
        "--json",
    ]);
    let points = points["points"].as_array().expect("points");
    let mut seen: Vec<(u64, u64)> =
        points.iter().map(|p| (p["rank"].as_u64().unwrap(), p["step"].as_f64().unwrap() as u64)).collect();
    seen.sort_unstable();
    let steps = 6 * 80 / (2 * 4);
    let want: Vec<(u64, u64)> = (0..2).flat_map(|r| (1..=steps).map(move |s| (r, s))).collect();
    assert_eq!(seen, want, "every (rank, step) loss exactly once");

    let runs = json(&["runs", "--coordinator", &addr, "--json"]);
    let run = runs["runs"].as_array().unwrap().iter().find(|r| r["run_id"] == "outage").expect("the run");
    assert_eq!(
        (run["state"].as_str(), run["world_size"].as_u64(), run["joined"].as_u64()),
        (Some("finished"), Some(2), Some(2)),
        "{run}"
    );
}

#[test]
fn a_coordinator_gone_for_good_costs_the_metrics_not_the_run() {
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let only = coordinator(port, store.path(), &[]);
    let mut run = training(&addr, "gone", out.path(), &[("DROVE_METRICS_FLUSH_SECS", "3")]);
    wait_for_step(&mut run, 3);
    only.signal(libc::SIGKILL);
    let started = Instant::now();
    let (status, _, err) = run.finish(DEADLINE);
    assert!(status.success(), "the run failed without its coordinator: {err}");
    for rank in 0..2 {
        let warned = err.lines().any(|l| {
            l.starts_with(&format!("[{rank}] warning: rank {rank}: ")) && l.contains("not delivered")
        });
        assert!(warned, "rank {rank} names the points it could not deliver:\n{err}");
    }
    eprintln!("the run ended {:.1?} after the coordinator was killed", started.elapsed());
    assert!(out.path().join("checkpoints/latest").exists(), "the checkpoint is complete");
}

#[test]
fn a_stopped_rank_is_named_and_the_world_stopped() {
    let store = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _coord = coordinator(port, store.path(), &["--heartbeat-timeout-ms", "4000"]);
    let mut run = training(&addr, "hung", out.path(), &[("DROVE_HEARTBEAT_SECS", "0.5")]);
    wait_for_step(&mut run, 3);
    let pid = rank_pid(run.pid, 1).expect("rank 1's pid");
    // SAFETY: stopping a grandchild this test started (rank 1 of its drove run).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let stopped = Instant::now();
    let (status, _, err) = run.finish(DEADLINE);
    let took = stopped.elapsed();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("failed: rank 1 on host ") && err.contains("sent no heartbeat"),
        "drove run names the stopped rank:\n{err}"
    );
    // The heartbeat limit (4 s), a check period, the grace period (2 s), and slack for a loaded machine.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    // SAFETY: kill(pid, 0) only checks whether the process exists.
    assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "rank 1 is gone");
}

/// The pid of rank `rank` among the children of `drove run` (`parent`): the
/// child whose environment says `DROVE_RANK=rank`.
fn rank_pid(parent: i32, rank: usize) -> Option<i32> {
    let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children.split_whitespace().filter_map(|p| p.parse::<i32>().ok()).find(|pid| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == format!("DROVE_RANK={rank}").as_bytes()))
    })
}

//! Real processes on 127.0.0.1: 2, 3 and 4 ranks (this test binary run again
//! as a rank: [`worker`]), over shared memory and over the TCP ring; and
//! worlds whose ranks `DROVE_HOST_ID` spreads over several hosts, for the
//! hierarchical all-reduce (the namespace tests of drove-cli run it across
//! real network namespaces).
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

#[path = "multiprocess/worker.rs"]
mod worker;

/// Set to a scenario's arguments, this binary runs as one rank of it.
const WORKER: &str = "DROVE_COMM_TEST_WORKER";

/// The rank process's entry: a no-op in the test run; in a process that
/// [`rank_process`] starts, it runs the scenario and exits.
#[test]
fn rank_process_entry() {
    if let Ok(args) = std::env::var(WORKER) {
        worker::main(&args);
    }
}

/// A command that runs this test binary as one rank of scenario `args`.
fn rank_process(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args(["rank_process_entry", "--exact", "--nocapture", "--test-threads=1", "-q"])
        .env(WORKER, args.join(" "));
    cmd
}

/// The JSON line a rank printed (libtest prints its own lines around it).
fn json_line(stdout: &[u8]) -> Option<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
}

struct World {
    outputs: Vec<Output>,
    results: Vec<Option<Value>>,
    elapsed: Duration,
}

/// Runs `n` ranks of the worker; kills them all if they outlive `limit`.
fn run_world(n: usize, transport: &str, args: &[&str], timeout_s: &str, limit: Duration) -> World {
    run_world_on(&vec![""; n], transport, args, timeout_s, limit)
}

/// Runs a rank of the worker for each of `hosts`, rank `r` told it is on
/// host `hosts[r]` (`DROVE_HOST_ID`; empty: its real host).
fn run_world_on(hosts: &[&str], transport: &str, args: &[&str], timeout_s: &str, limit: Duration) -> World {
    let n = hosts.len();
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let children: Vec<Child> = (0..n)
        .map(|rank| {
            let mut cmd = rank_process(args);
            if !hosts[rank].is_empty() {
                cmd.env("DROVE_HOST_ID", hosts[rank]);
            }
            cmd.env("DROVE_RANK", rank.to_string())
                .env("DROVE_WORLD_SIZE", n.to_string())
                .env("DROVE_RENDEZVOUS_DIR", dir.path())
                .env("DROVE_COMM_TRANSPORT", transport)
                .env("DROVE_COMM_TIMEOUT", timeout_s)
                .env_remove("RUST_LOG")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawning a rank process")
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    // A stalled rank waits for its stdin to close: closed once the others are done.
    let mut children = children;
    let mut stdins: Vec<_> = children.iter_mut().map(|c| c.stdin.take()).collect();
    let (tx, rx) = mpsc::channel();
    for (rank, child) in children.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((rank, child.wait_with_output()));
        });
    }
    drop(tx);
    let mut outputs: Vec<Option<Output>> = (0..n).map(|_| None).collect();
    for done in 0..n {
        if done + 1 == n {
            stdins.clear();
        }
        let left = limit.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok((rank, out)) => outputs[rank] = Some(out.expect("waiting for a worker")),
            Err(_) => {
                for pid in &pids {
                    // SAFETY: signalling our own children.
                    unsafe {
                        libc::kill(*pid as i32, libc::SIGKILL);
                    }
                }
                panic!("ranks still running after {limit:?}: {transport} {args:?}");
            }
        }
    }
    let elapsed = start.elapsed();
    let outputs: Vec<Output> = outputs.into_iter().map(|o| o.expect("every rank reported")).collect();
    let results = outputs.iter().map(|o| json_line(&o.stdout)).collect();
    World { outputs, results, elapsed }
}

fn describe(w: &World) -> String {
    w.outputs
        .iter()
        .enumerate()
        .map(|(r, o)| {
            format!(
                "rank {r}: {:?}\n  stdout: {}\n  stderr: {}",
                o.status,
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The ranks in "lost rank(s) [a, b]".
fn lost_ranks(err: &str) -> Vec<usize> {
    let Some(start) = err.find("lost rank(s) [") else { return Vec::new() };
    let rest = &err[start + "lost rank(s) [".len()..];
    rest[..rest.find(']').unwrap_or(0)].split(", ").filter_map(|r| r.parse().ok()).collect()
}

fn all_succeeded(w: &World) -> Vec<Value> {
    assert!(w.outputs.iter().all(|o| o.status.success()), "a rank failed:\n{}", describe(w));
    w.results.iter().map(|r| r.clone().expect("JSON result")["result"].clone()).collect()
}

#[test]
fn closed_form_results_for_every_dtype_op_and_dimension() {
    for transport in ["auto", "tcp"] {
        for n in [2, 3, 4] {
            let w = run_world(n, transport, &["closed-form"], "30", Duration::from_secs(120));
            for (rank, r) in all_succeeded(&w).iter().enumerate() {
                let failures = r["failures"].as_array().unwrap();
                assert!(failures.is_empty(), "{transport} n={n} rank {rank}: {failures:#?}");
                assert!(r["checks"].as_u64().unwrap() >= 190, "{r}");
            }
        }
    }
}

#[test]
fn disagreements_fail_on_every_rank_and_leave_the_communicator_usable() {
    for transport in ["auto", "tcp"] {
        for n in [2, 3, 4] {
            let w = run_world(n, transport, &["errors"], "30", Duration::from_secs(60));
            for (rank, r) in all_succeeded(&w).iter().enumerate() {
                let errs = r["errors"].as_array().unwrap();
                let field = |i: usize| errs[i]["field"].as_str().unwrap().to_string();
                let msg = |i: usize| errs[i]["message"].as_str().unwrap().to_string();
                assert!(
                    errs.iter().all(|e| e["ok"] == false && e["recoverable"] == true),
                    "rank {rank}: {errs:#?}"
                );
                assert_eq!(field(0), "shape", "{}", msg(0));
                assert!(
                    msg(0).contains("[17, 17, 17] on rank 0") && msg(0).contains("[18, 18, 18] on rank 1"),
                    "{}",
                    msg(0)
                );
                assert_eq!(field(1), "shape");
                assert!(
                    msg(1).contains("[17, 1311]") && msg(1).contains("[17, 23, 57] on rank"),
                    "{}",
                    msg(1)
                );
                assert_eq!(field(2), "dtype");
                assert!(msg(2).contains("i32 on rank") && msg(2).contains("f32 on rank"), "{}", msg(2));
                assert_eq!(field(3), "root");
                assert!(
                    msg(3).contains("root 0 on rank 0") && msg(3).contains("root 1 on rank 1"),
                    "{}",
                    msg(3)
                );
                assert_eq!(field(4), "invalid");
                assert!(
                    msg(4).contains(&format!("rank {}", n - 1)) && msg(4).contains("holds 6 elements"),
                    "{}",
                    msg(4)
                );
                assert!(msg(0).starts_with("all_reduce \"shapes\""), "{}", msg(0));
                assert_eq!(
                    r["usable_after"],
                    serde_json::json!([true, true, true, true, true]),
                    "rank {rank}"
                );
            }
        }
    }
}

#[test]
fn a_rank_killed_mid_allreduce_fails_the_others_within_the_deadline() {
    for transport in ["auto", "tcp"] {
        let deadline_s = 10;
        // Rank 1 SIGKILLs itself after moving 32 MiB of a 256 MiB all-reduce.
        let w = run_world(
            3,
            transport,
            &["kill", "1", &(32u64 << 20).to_string(), "256"],
            &deadline_s.to_string(),
            Duration::from_secs(60),
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            w.outputs[1].status.signal(),
            Some(libc::SIGKILL),
            "{transport}: victim\n{}",
            describe(&w)
        );
        for rank in [0, 2] {
            assert!(w.outputs[rank].status.success(), "{transport}: rank {rank}\n{}", describe(&w));
            let r = &w.results[rank].as_ref().expect("JSON")["result"];
            let err =
                r["error"].as_str().unwrap_or_else(|| panic!("{transport}: rank {rank} saw no error: {r}"));
            assert!(err.contains("all_reduce \"big\""), "{err}");
            assert!(lost_ranks(err).contains(&1), "{transport}: rank {rank} should name rank 1: {err}");
            assert!(r["elapsed_ms"].as_u64().unwrap() < deadline_s * 1000, "{r}");
        }
        assert!(w.elapsed < Duration::from_secs(deadline_s + 20), "{:?}", w.elapsed);
    }
}

#[test]
fn fused_buckets_equal_the_unfused_result() {
    for transport in ["auto", "tcp"] {
        let w = run_world(3, transport, &["fusion"], "30", Duration::from_secs(120));
        for r in all_succeeded(&w) {
            assert_eq!(r["unfused_ok"], true);
            assert_eq!(r["tensors"], 200);
            let res = &r["results"];
            // The rows of ranks 0 and 1 (20 and 20), rank 2 sending none.
            assert_eq!(res["rows"]["sparse_rows"], 40, "{res}");
            for exact in ["fused_64mib", "fused_256kib", "unfused_0", "rows"] {
                assert_eq!(res[exact]["ok"], true, "{exact}: {res}");
                assert_eq!(res[exact]["max_abs_diff"].as_f64(), Some(0.0), "{exact}: {res}");
            }
            // Values up to 24 in half precision: within a rounding step.
            assert!(res["fused_f16"]["max_abs_diff"].as_f64().unwrap() <= 0.02, "{res}");
            assert!(res["fused_bf16"]["max_abs_diff"].as_f64().unwrap() <= 0.2, "{res}");
        }
    }
}

#[test]
fn a_stalled_rank_is_named_in_a_warning_and_then_in_the_timeout_error() {
    for transport in ["auto", "tcp"] {
        let w = run_world(3, transport, &["stall", "1"], "2", Duration::from_secs(60));
        all_succeeded(&w);
        for rank in [0, 2] {
            let r = &w.results[rank].as_ref().expect("JSON")["result"];
            let err = r["error"].as_str().unwrap_or_else(|| panic!("rank {rank} saw no error: {r}"));
            // Timed out on rank 1; or, if the other survivor timed out a moment earlier
            // and exited, still names rank 1 first, as silent, and the other as hung up.
            assert!(
                err.contains("timed out after 2.0s waiting for rank(s) [1]")
                    || (err.contains("rank(s) [1] silent for") && err.contains("hung up meanwhile")),
                "{transport}: {err}"
            );
            let ms = r["elapsed_ms"].as_u64().unwrap();
            // Its own deadline is 2 s; the other survivor's may pass a few ms sooner
            // (their ops start apart), and its exit is then seen first (after the warning).
            let earliest = if err.contains("timed out") { 2000 } else { 600 };
            assert!((earliest..10_000).contains(&ms), "{transport}: failed after {ms} ms: {err}");
            let log = String::from_utf8_lossy(&w.outputs[rank].stderr);
            assert!(
                log.contains("WARN") && log.contains("still waiting for rank(s) [1]"),
                "{transport}: {log}"
            );
        }
    }
}

#[test]
fn a_static_file_of_addresses_is_a_rendezvous() {
    // Reserve three loopback ports, then hand them to the ranks in a peers file.
    let listeners: Vec<_> = (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    drop(listeners);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("peers.txt");
    std::fs::write(&file, format!("# one address per rank\n{}\n", addrs.join("\n"))).unwrap();
    let children: Vec<_> = (0..3)
        .map(|rank| {
            rank_process(&["sum-rank"])
                .env("DROVE_RANK", rank.to_string())
                .env("DROVE_WORLD_SIZE", "3")
                .env("DROVE_PEERS_FILE", &file)
                .env("DROVE_COMM_TIMEOUT", "20")
                .env_remove("DROVE_RENDEZVOUS_DIR")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v = json_line(&out.stdout).expect("a JSON line");
        assert_eq!(v["result"]["sum"], 3);
    }
}

/// Hosts by rank: 2 x 2, uneven (2 + 1), and interleaved with a host alone
/// (ranks 0, 2 on one host, 1, 3 on another, 4 alone).
const HOST_LAYOUTS: [&[&str]; 3] = [&["a", "a", "b", "b"], &["a", "b", "a"], &["a", "b", "a", "b", "c"]];

fn transports(w: &World) -> Vec<String> {
    w.results
        .iter()
        .map(|r| r.as_ref().and_then(|r| r["transport"].as_str()).unwrap_or_default().to_string())
        .collect()
}

#[test]
fn hierarchical_all_reduce_gives_the_closed_form_results_on_every_layout_of_hosts() {
    for hosts in HOST_LAYOUTS {
        let w = run_world_on(hosts, "hierarchical", &["closed-form"], "30", Duration::from_secs(120));
        for (rank, r) in all_succeeded(&w).iter().enumerate() {
            let failures = r["failures"].as_array().unwrap();
            assert!(failures.is_empty(), "{hosts:?} rank {rank}: {failures:#?}");
            assert!(r["checks"].as_u64().unwrap() >= 190, "{r}");
        }
        assert!(transports(&w).iter().all(|t| t == "hierarchical"), "{hosts:?}: {:?}", transports(&w));
    }
}

#[test]
fn hierarchical_disagreements_fail_on_every_rank_before_any_data_moves() {
    let w = run_world_on(HOST_LAYOUTS[0], "auto", &["errors"], "30", Duration::from_secs(60));
    assert!(transports(&w).iter().all(|t| t == "hierarchical"), "{:?}", transports(&w));
    for (rank, r) in all_succeeded(&w).iter().enumerate() {
        let errs = r["errors"].as_array().unwrap();
        assert!(errs.iter().all(|e| e["ok"] == false && e["recoverable"] == true), "rank {rank}: {errs:#?}");
        let first = errs[0]["message"].as_str().unwrap();
        assert!(
            first.contains("[17, 17, 17] on rank 0") && first.contains("[18, 18, 18] on rank 1"),
            "{first}"
        );
        assert_eq!(r["usable_after"], serde_json::json!([true, true, true, true, true]), "rank {rank}");
    }
}

#[test]
fn a_rank_killed_mid_hierarchical_all_reduce_is_named_on_both_hosts() {
    let deadline_s = 10;
    // Rank 1 (not a leader) dies in its host's reduction, rank 2 (host b's
    // leader) in the ring between the hosts; each after 32 MiB of 256 MiB.
    for victim in [1usize, 2] {
        let w = run_world_on(
            HOST_LAYOUTS[0],
            "hierarchical",
            &["kill", &victim.to_string(), &(32u64 << 20).to_string(), "256"],
            &deadline_s.to_string(),
            Duration::from_secs(60),
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            w.outputs[victim].status.signal(),
            Some(libc::SIGKILL),
            "victim {victim}\n{}",
            describe(&w)
        );
        for rank in (0..4).filter(|&r| r != victim) {
            assert!(w.outputs[rank].status.success(), "victim {victim}: rank {rank}\n{}", describe(&w));
            let r = &w.results[rank].as_ref().expect("JSON")["result"];
            let err = r["error"].as_str().unwrap_or_else(|| panic!("rank {rank} saw no error: {r}"));
            assert!(err.contains("all_reduce \"big\""), "{err}");
            assert!(lost_ranks(err).contains(&victim), "victim {victim}: rank {rank} should name it: {err}");
            assert!(r["elapsed_ms"].as_u64().unwrap() < deadline_s * 1000, "{r}");
        }
    }
}

//! Beyond one host: a coordinator and 3 ranks, each in its own network
//! namespace with its own address on a bridge of veth pairs, made by the test
//! with names unique to the run and removed even when it fails (Linux, root;
//! skipped with a printed reason elsewhere).
//!
//! The namespaces share one kernel; a host is a kernel and a network namespace,
//! so each namespace counts as a host and one rank per namespace runs the TCP
//! ring (the ranks are also told `DROVE_COMM_TRANSPORT=tcp`, and the test
//! asserts that the ring ran).
//!
//! A namespace's link set down mid-run: no connection closes, so the others
//! learn of it only at the deadline; the ring neighbour that has bytes stuck on
//! the way to the lost rank names it from the kernel's retransmission state,
//! the one waiting on it names it as the rank it waited for, and the cut-off
//! rank gives up too (its metrics push to the coordinator is bounded).
//!
//! In an elastic run (`--world 2:3`) the same cut costs the others one step:
//! they re-form without the cut-off member at the deadline and finish.
//!
//! Two namespaces of two ranks each are two hosts (a host is a kernel and a
//! network namespace): `drove check --size` all-reduces closed-form tensors
//! hierarchically (shared memory within a namespace, the ring between them)
//! and over the flat ring, and both must check out, the integers bit for bit
//! alike; a mismatch and a namespace cut off mid-op are named on the others.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::Duration;

use crate::common::netns::{Net, unsupported};
use crate::common::{
    DROVE, assert_each_once, assets, read_latest, relative_difference, run, text, tiny_training, traced,
    under_run,
};

/// One test at a time builds namespaces (their names are per process).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: OnceLock<std::sync::Mutex<()>> = OnceLock::new();
    LOCK.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// Processes killed when the test ends, however it ends (`ip netns exec`
/// execs its program, so the pid is the program's).
struct Reaper(Vec<u32>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for &pid in &self.0 {
            // SAFETY: kill(2) on a process this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

/// A coordinator in namespace 0, returned once it says it is listening.
fn coordinator(net: &Net, store: &Path, reaper: &mut Reaper) -> String {
    let addr = format!("{}:50051", net.addr(0));
    let mut child = net
        .exec(0, Path::new(DROVE))
        .args(["coordinator", "--listen", &addr, "--store"])
        .arg(store)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the coordinator");
    let stdout = child.stdout.take().expect("piped");
    reaper.0.push(child.id());
    std::thread::spawn(move || child.wait());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60)).expect("the coordinator did not start listening within 60 s");
    format!("http://{addr}")
}

/// What every test here starts from, one test at a time: the namespaces, a
/// folder, the processes to reap, and a coordinator in namespace 0. Dropped
/// in that order: processes killed, folder removed, namespaces deleted.
struct Hosts {
    reaper: Reaper,
    dir: tempfile::TempDir,
    net: Net,
    coord: String,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl Hosts {
    /// `spaces` namespaces; `None`, the reason printed, where they cannot be made.
    fn new(spaces: usize) -> Option<Hosts> {
        let one = serial();
        if let Some(why) = unsupported() {
            crate::common::skip(&why);
            return None;
        }
        let net = Net::new(spaces).expect("building the namespaces");
        let dir = tempfile::tempdir().unwrap();
        let mut reaper = Reaper(Vec::new());
        let coord = coordinator(&net, &dir.path().join("store"), &mut reaper);
        Some(Hosts { reaper, dir, net, coord, _one: one })
    }
}

/// A rank in namespace `1 + rank`, asking the coordinator for `rank`.
fn rank(net: &Net, coordinator: &str, run_id: &str, world: usize, rank: usize, args: &[&str]) -> Command {
    let mut cmd = net.exec(1 + rank, Path::new(DROVE));
    cmd.args(args)
        .env("DROVE_COORDINATOR", coordinator)
        .env("DROVE_RUN_ID", run_id)
        .env("DROVE_WORLD_SIZE", world.to_string())
        .env("DROVE_RANK", rank.to_string())
        .env("DROVE_COMM_TRANSPORT", "tcp")
        .env("RAYON_NUM_THREADS", "1")
        .env("RUST_LOG", "warn");
    cmd
}

/// Runs the commands at once and waits for all (each with the common deadline).
fn all(cmds: Vec<Command>) -> Vec<Output> {
    let handles: Vec<_> = cmds.into_iter().map(|mut c| std::thread::spawn(move || run(&mut c))).collect();
    handles.into_iter().map(|h| h.join().expect("a rank's thread")).collect()
}

fn train_args(out: &Path, assets: &Path, epochs: usize) -> Vec<String> {
    let mut args: Vec<String> = ["train", "ner", "--max-train-sentences", "24", "--batch-size", "4"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(format!("--epochs={epochs}"));
    args.extend(
        ["--dropout", "0", "--eval", "", "--lr-scaling", "none", "--lr", "1e-3", "--warmup", "0"]
            .map(String::from),
    );
    args.extend(["--micro-batches", "1", "--workers", "1"].map(String::from));
    args.push(format!("--data={}", assets.join("conll2003").display()));
    args.push(format!("--model={}", assets.join("minilm").display()));
    args.push(format!("--out={}", out.display()));
    args
}

#[test]
fn three_ranks_in_their_own_namespaces_sum_over_the_tcp_ring_and_train_as_on_loopback() {
    let Some(h) = Hosts::new(4) else { return };

    let outs = all((0..3).map(|r| rank(&h.net, &h.coord, "check", 3, r, &["check", "--json"])).collect());
    for (r, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "rank {r}: {}", text(out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
        assert_eq!(report["rank"], r as u64, "{report}");
        assert_eq!(report["sum"], 3, "0 + 1 + 2: {report}");
        assert_eq!(report["transport"], "tcp", "{report}");
    }

    let assets = assets().clone();
    let (hosts, loopback) = (h.dir.path().join("hosts"), h.dir.path().join("loopback"));
    let args = train_args(&hosts, &assets, 2);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outs = all((0..3).map(|r| rank(&h.net, &h.coord, "train", 3, r, &args)).collect());
    for (r, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "rank {r}: {}", text(out));
    }
    let local_args = train_args(&loopback, &assets, 2);
    let mut local = Command::new(DROVE);
    local
        .args(&local_args)
        .env("DROVE_COMM_TRANSPORT", "tcp")
        .env("RAYON_NUM_THREADS", "1")
        .env("RUST_LOG", "warn");
    let out = run(&mut under_run(3, local));
    assert!(out.status.success(), "{}", text(&out));
    let d = relative_difference(
        &read_latest(&hosts.join("checkpoints")),
        &read_latest(&loopback.join("checkpoints")),
    );
    eprintln!("namespaces vs loopback: {d:e}");
    assert!(d < 1e-5, "the run across namespaces differs from the one on loopback by {d} (relative)");
}

/// One rank's process, its stderr streamed line by line to `lines`.
fn start(
    mut cmd: Command,
    rank: usize,
    reaper: &mut Reaper,
    lines: mpsc::Sender<(usize, String)>,
) -> std::process::Child {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting rank {rank}: {e}"));
    reaper.0.push(child.id());
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send((rank, line)).is_err() {
                break;
            }
        }
    });
    child
}

/// The ranks an error names first: `lost rank(s) [2]`, `rank(s) [2] silent`,
/// `waiting for rank(s) [2]`.
fn first_named(error: &str) -> Option<Vec<usize>> {
    let list = error.split_once("rank(s) [")?.1.split_once(']')?.0;
    list.split(", ").map(|n| n.parse().ok()).collect()
}

#[test]
fn a_namespace_cut_off_mid_run_is_named_by_the_others_within_the_deadline() {
    const TIMEOUT_S: u64 = 10;
    let Some(mut h) = Hosts::new(4) else { return };
    let assets = assets().clone();
    let mut args = train_args(&h.dir.path().join("out"), &assets, 200);
    args.extend(["--log-every", "1"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let (tx, lines) = mpsc::channel();
    let mut children: Vec<_> = (0..3)
        .map(|r| {
            let mut cmd = rank(&h.net, &h.coord, "cut", 3, r, &args);
            cmd.env("DROVE_COMM_TIMEOUT", TIMEOUT_S.to_string()).env("DROVE_COMM_WARN_AFTER", "5");
            start(cmd, r, &mut h.reaper, tx.clone())
        })
        .collect();
    drop(tx);
    let mut logs: Vec<Vec<String>> = vec![Vec::new(); 3];
    // Mid-run: rank 0 has logged its second step.
    loop {
        let (r, line) = lines.recv_timeout(Duration::from_secs(300)).expect("no second step within 300 s");
        let second = r == 0 && line.starts_with("step 2/");
        logs[r].push(line);
        if second {
            break;
        }
    }
    h.net.cut(3).expect("setting rank 2's link down");
    let cut = std::time::Instant::now();

    // Every rank exits by itself, well within the deadline plus its teardown.
    let limit = Duration::from_secs(TIMEOUT_S + 50);
    let mut status = vec![None; 3];
    while status.iter().any(Option::is_none) {
        for (r, child) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = child.try_wait().expect("waiting for a rank");
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        assert!(
            cut.elapsed() < limit,
            "ranks still running {:?} after the cut: {status:?}\n{logs:#?}",
            cut.elapsed()
        );
        // Block on the ranks' output, which ends when they exit.
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok((r, line)) => logs[r].push(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::yield_now(),
        }
    }
    while let Ok((r, line)) = lines.recv_timeout(Duration::from_secs(5)) {
        logs[r].push(line);
    }
    let took = cut.elapsed();
    eprintln!("all ranks gone {took:.1?} after the cut");
    for (r, s) in status.iter().enumerate() {
        assert!(!s.expect("exited").success(), "rank {r} succeeded after the cut:\n{}", logs[r].join("\n"));
    }
    for r in [0, 1] {
        let error = logs[r].iter().find(|l| l.starts_with("error:"));
        let error = error.unwrap_or_else(|| panic!("rank {r} printed no error:\n{}", logs[r].join("\n")));
        eprintln!("rank {r}: {error}");
        assert_eq!(
            first_named(error),
            Some(vec![2]),
            "rank {r} does not name the lost rank 2 first: {error}"
        );
    }
    assert!(
        took < Duration::from_secs(TIMEOUT_S + 40),
        "the ranks took {took:.1?} to fail after the cut (deadline {TIMEOUT_S} s)"
    );
}

/// Sentences of the elastic run: 100 steps of 3 members x 2 rows, so the
/// cut lands mid-run and most of the epoch is left for the world of 2.
const ELASTIC_SENTENCES: usize = 600;

#[test]
fn an_elastic_member_whose_namespace_is_cut_off_is_lost_and_the_others_finish() {
    const TIMEOUT_S: u64 = 5;
    let Some(mut h) = Hosts::new(4) else { return };
    let (tx, lines) = mpsc::channel();
    let mut members: Vec<_> = (0..3)
        .map(|m| {
            let mut cmd = h.net.exec(1 + m, Path::new(DROVE));
            cmd.args(tiny_training(h.dir.path(), ELASTIC_SENTENCES, &h.dir.path().join(format!("out-{m}"))))
                .args(["--world", "2:3"])
                .env("DROVE_COORDINATOR", &h.coord)
                .env("DROVE_RUN_ID", "cut-elastic")
                .env("DROVE_MEMBER_ID", format!("m{m}"))
                .env("DROVE_COMM_TRANSPORT", "tcp")
                .env("DROVE_COMM_TIMEOUT", TIMEOUT_S.to_string())
                .env("DROVE_RENDEZVOUS_TIMEOUT_SECS", "30")
                .env("RAYON_NUM_THREADS", "1")
                .env("RUST_LOG", "warn");
            start(cmd, m, &mut h.reaper, tx.clone())
        })
        .collect();
    drop(tx);
    let mut logs: Vec<Vec<String>> = vec![Vec::new(); 3];
    loop {
        let (m, line) = lines.recv_timeout(Duration::from_secs(300)).expect("no step 3 within 300 s");
        let third = line.starts_with("step 3/");
        logs[m].push(line);
        if third {
            break;
        }
    }
    h.net.cut(3).expect("setting member m2's link down");
    let cut = std::time::Instant::now();

    // m0 and m1 re-form without m2 at the deadline and finish the epoch.
    let limit = Duration::from_secs(TIMEOUT_S + 120);
    let mut status = [None, None];
    while status.iter().any(Option::is_none) {
        for (m, child) in members.iter_mut().take(2).enumerate() {
            if status[m].is_none() {
                status[m] = child.try_wait().expect("waiting for a member");
            }
        }
        assert!(cut.elapsed() < limit, "members still running {:?} after the cut\n{logs:#?}", cut.elapsed());
        match lines.recv_timeout(Duration::from_millis(200)) {
            Ok((m, line)) => logs[m].push(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::yield_now(),
        }
    }
    for (m, s) in status.iter().enumerate() {
        assert!(s.expect("exited").success(), "member m{m} failed after the cut:\n{}", logs[m].join("\n"));
    }
    let _ = members[2].kill();
    let (worlds, applied) = traced(h.dir.path());
    assert_eq!(worlds, [(1, 3), (2, 2)], "3 members, then 2 without the cut-off one:\n{logs:#?}");
    assert_each_once(&applied, ELASTIC_SENTENCES);
    let reformed = logs[..2].concat().into_iter().find(|l| l.contains("generation 2: rank 0 of 2"));
    assert!(reformed.is_some(), "rank 0 of the new world says it re-formed:\n{logs:#?}");
}

/// Rank `rank` of 4 on two hosts: ranks 0 and 1 in namespace 1, 2 and 3 in
/// namespace 2 (the coordinator is in namespace 0); `transport` as
/// `DROVE_COMM_TRANSPORT` says.
fn two_by_two(
    net: &Net,
    coordinator: &str,
    run_id: &str,
    transport: &str,
    rank: usize,
    args: &[&str],
) -> Command {
    let mut cmd = net.exec(1 + rank / 2, Path::new(DROVE));
    cmd.args(args)
        .env("DROVE_COORDINATOR", coordinator)
        .env("DROVE_RUN_ID", run_id)
        .env("DROVE_WORLD_SIZE", "4")
        .env("DROVE_RANK", rank.to_string())
        .env("DROVE_COMM_TRANSPORT", transport)
        .env_remove("DROVE_HOST_ID")
        .env("RUST_LOG", "warn");
    cmd
}

/// Each rank's `drove check --json` report, all asserted successful.
fn reports(outs: &[Output]) -> Vec<serde_json::Value> {
    outs.iter()
        .enumerate()
        .map(|(r, out)| {
            assert!(out.status.success(), "rank {r}: {}", text(out));
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("rank {r}: {e}: {}", text(out)))
        })
        .collect()
}

#[test]
fn two_hosts_of_two_ranks_all_reduce_hierarchically_to_the_flat_rings_results() {
    let Some(h) = Hosts::new(3) else { return };
    // 750,001 floats and 375,000 integers: segments of unequal lengths.
    let args = ["check", "--json", "--size", "3000004"];
    let run = |transport: &str| {
        let cmds =
            (0..4).map(|r| two_by_two(&h.net, &h.coord, &format!("check-{transport}"), transport, r, &args));
        reports(&all(cmds.collect()))
    };
    let (hier, flat) = (run("auto"), run("tcp"));
    for (name, world, transport) in [("hierarchical", &hier, "hierarchical"), ("flat", &flat, "tcp")] {
        for (r, report) in world.iter().enumerate() {
            assert_eq!(report["transport"], transport, "{name} rank {r}: {report}");
            assert_eq!(report["sum"], 6, "{name} rank {r}: {report}");
            assert!(report["float_error_eps"].as_f64().unwrap() <= 3.0, "{name} rank {r}: {report}");
            for digest in ["int_digest", "float_digest"] {
                assert_eq!(
                    report[digest], world[0][digest],
                    "{name}: rank {r} differs from rank 0: {report}"
                );
            }
        }
    }
    assert_eq!(hier[0]["int_digest"], flat[0]["int_digest"], "integer sums differ:\n{hier:?}\n{flat:?}");
    eprintln!(
        "floats: hierarchical {} eps, flat {} eps, digests {} and {}",
        hier[0]["float_error_eps"],
        flat[0]["float_error_eps"],
        hier[0]["float_digest"],
        flat[0]["float_digest"]
    );
}

#[test]
fn across_two_hosts_a_mismatch_is_named_on_every_rank_and_a_host_cut_off_mid_op_within_the_deadline() {
    const TIMEOUT_S: u64 = 6;
    let Some(mut h) = Hosts::new(3) else { return };

    // Rank 3 was started with another size: every rank names it.
    let outs = all((0..4)
        .map(|r| {
            let size = if r == 3 { "2MiB" } else { "1MiB" };
            two_by_two(&h.net, &h.coord, "mismatch", "auto", r, &["check", "--size", size])
        })
        .collect());
    for (r, out) in outs.iter().enumerate() {
        assert!(!out.status.success(), "rank {r} succeeded: {}", text(out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("ranks disagree on shape")
                && err.contains("on rank 3")
                && err.contains("on ranks [0, 1, 2]"),
            "rank {r}: {err}"
        );
    }

    // Namespace 2 (ranks 2 and 3) goes down in the middle of the ops.
    let (tx, lines) = mpsc::channel();
    let mut children: Vec<_> = (0..4)
        .map(|r| {
            let mut cmd = two_by_two(
                &h.net,
                &h.coord,
                "cut",
                "auto",
                r,
                &["check", "--size", "16MiB", "--iterations", "100000"],
            );
            cmd.env("DROVE_COMM_TIMEOUT", TIMEOUT_S.to_string()).env("DROVE_COMM_WARN_AFTER", "3");
            start(cmd, r, &mut h.reaper, tx.clone())
        })
        .collect();
    drop(tx);
    let mut logs: Vec<Vec<String>> = vec![Vec::new(); 4];
    // Every rank has checked its second all-reduce: the third's data is moving.
    let mut second = [false; 4];
    while !second.iter().all(|&s| s) {
        let (r, line) =
            lines.recv_timeout(Duration::from_secs(120)).expect("no second all-reduce within 120 s");
        second[r] |= line.contains("all-reduce 2/");
        logs[r].push(line);
    }
    h.net.cut(2).expect("setting namespace 2's link down");
    let cut = std::time::Instant::now();
    for r in [0, 1] {
        let status = children[r].wait().expect("waiting for a rank");
        while let Ok((from, line)) = lines.recv_timeout(Duration::from_millis(100)) {
            logs[from].push(line);
        }
        assert!(!status.success(), "rank {r} succeeded after the cut:\n{}", logs[r].join("\n"));
        let error = logs[r].iter().find(|l| l.starts_with("error:"));
        let error = error.unwrap_or_else(|| panic!("rank {r} printed no error:\n{}", logs[r].join("\n")));
        eprintln!("rank {r} after {:.1?}: {error}", cut.elapsed());
        // Cut during the description round, every rank waits for both; during
        // the data, rank 0 for host 2's leader and rank 1 hears it from rank 0.
        let named = first_named(error).unwrap_or_default();
        assert!(
            !named.is_empty() && named.iter().all(|n| [2, 3].contains(n)),
            "rank {r} does not name the cut-off host's ranks 2 and 3 first: {error}"
        );
    }
    let took = cut.elapsed();
    assert!(took < Duration::from_secs(TIMEOUT_S + 10), "ranks 0 and 1 took {took:.1?} after the cut");
    for child in &mut children[2..] {
        let _ = child.kill();
    }
}

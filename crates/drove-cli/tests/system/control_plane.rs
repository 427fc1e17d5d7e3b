//! `drove run`, `drove check`, `drove coordinator`, `drove metrics`, `drove runs`
//! (with the generations of an elastic run) and `drove bench coordinator`, as
//! real processes talking to real coordinators on loopback. Every wait has a
//! deadline; nothing waits by sleeping.

use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use crate::common::Proc;

use drove_control::Clients;
use drove_proto::v1::{EndKind, GenerationEnd, JoinRequest, MetricPoint, PushRequest};
use serde_json::Value;

const DROVE: &str = env!("CARGO_BIN_EXE_drove");
/// Long enough for a loaded machine; a hang still ends the test.
const DEADLINE: Duration = Duration::from_secs(60);

/// Runs drove to completion within the deadline.
fn drove(args: &[&str], within: Duration) -> (ExitStatus, Vec<String>, String) {
    Proc::drove(args).finish(within)
}

/// A `drove coordinator` child on a free loopback port and a temporary store.
struct Coordinator {
    addr: String,
    _proc: Proc,
    _store: tempfile::TempDir,
}

impl Coordinator {
    fn start(extra: &[&str]) -> Coordinator {
        let store = tempfile::tempdir().unwrap();
        let mut args =
            vec!["coordinator", "--listen", "127.0.0.1:0", "--store", store.path().to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut proc = Proc::drove(&args);
        let line = proc.line(DEADLINE, |l| l.contains("listening on "));
        let addr = line.rsplit("listening on ").next().unwrap().trim().to_string();
        assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{line}");
        Coordinator { addr, _proc: proc, _store: store }
    }
}

/// Whether a process with this pid exists (a zombie counts).
fn exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The pids `drove run` logged for its ranks (at debug level).
fn logged_pids(stderr: &str) -> Vec<i32> {
    stderr
        .lines()
        .filter_map(|l| l.split_once(" as pid ").map(|(_, p)| p.trim().parse().expect("a pid")))
        .collect()
}

/// The ranks' lines of `drove run`'s stdout, as (rank, text).
fn by_rank(lines: &[String]) -> Vec<(usize, String)> {
    let mut ranked: Vec<(usize, String)> = lines
        .iter()
        .map(|l| {
            let rest = l.strip_prefix('[').unwrap_or_else(|| panic!("unprefixed line {l:?}"));
            let (rank, text) = rest.split_once("] ").unwrap_or_else(|| panic!("unprefixed line {l:?}"));
            (rank.parse().unwrap(), text.to_string())
        })
        .collect();
    ranked.sort();
    ranked
}

#[test]
fn run_starts_ranks_that_all_reduce_and_prefixes_their_lines() {
    let (status, out, err) = drove(&["run", "--np", "4", "--", DROVE, "check"], DEADLINE);
    assert!(status.success(), "{status}\n{err}");
    let expected: Vec<(usize, String)> =
        (0..4).map(|r| (r, format!("rank {r} of 4: sum of ranks = 6"))).collect();
    assert_eq!(by_rank(&out), expected, "{out:?}");
    assert!(err.contains("coordinator=127.0.0.1:"), "the coordinator address is logged: {err}");
    assert!(err.contains("run_id=run-"), "the run id is logged: {err}");

    let (status, out, err) = drove(&["run", "--np", "2", "--", DROVE, "check", "--json"], DEADLINE);
    assert!(status.success(), "{status}\n{err}");
    let ranked = by_rank(&out);
    assert_eq!(ranked.len(), 2, "{out:?}");
    for (rank, text) in ranked {
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["rank"], rank);
        assert_eq!(v["world_size"], 2);
        assert_eq!(v["sum"], 1);
        assert!(v["transport"] == "shm" || v["transport"] == "tcp", "{v}");
    }
}

#[test]
fn ranks_get_their_environment_and_their_lines_are_relayed_whole() {
    let script = r#"echo "$DROVE_RANK $DROVE_LOCAL_RANK $DROVE_WORLD_SIZE $DROVE_RUN_ID $DROVE_COORDINATOR"; printf "no newline" >&2"#;
    let (status, out, err) =
        drove(&["run", "--np", "3", "--run-id", "env-test", "--", "sh", "-c", script], DEADLINE);
    assert!(status.success(), "{status}\n{err}");
    let ranked = by_rank(&out);
    assert_eq!(ranked.len(), 3, "{out:?}");
    for (rank, text) in ranked {
        let fields: Vec<&str> = text.split(' ').collect();
        assert_eq!(
            fields[..4],
            [rank.to_string(), rank.to_string(), "3".into(), "env-test".into()],
            "{text}"
        );
        assert!(fields[4].starts_with("127.0.0.1:") && fields[4].len() > "127.0.0.1:".len(), "{text}");
    }
    for rank in 0..3 {
        assert!(err.lines().any(|l| l == format!("[{rank}] no newline")), "{err}");
    }
}

#[test]
fn the_token_reaches_the_coordinator_and_the_ranks() {
    // In-process coordinator: it requires the token, so the ranks joined with it.
    let (status, out, err) = drove(&["run", "--np", "2", "--token", "t0k", "--", DROVE, "check"], DEADLINE);
    assert!(status.success(), "{status}\n{err}");
    assert_eq!(by_rank(&out).len(), 2, "{out:?}");

    let coordinator = Coordinator::start(&["--token", "s3cret"]);
    let addr = coordinator.addr.as_str();
    let (status, out, err) = drove(
        &["run", "--np", "2", "--coordinator", addr, "--token", "s3cret", "--", DROVE, "check"],
        DEADLINE,
    );
    assert!(status.success(), "{status}\n{err}");
    assert_eq!(by_rank(&out).len(), 2, "{out:?}");
    // A wrong token is refused before any rank starts.
    let (status, out, err) = drove(
        &["run", "--np", "2", "--coordinator", addr, "--token", "wrong", "--", DROVE, "check"],
        DEADLINE,
    );
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(out.is_empty(), "{out:?}");
    assert!(
        err.ends_with("error: the coordinator refused the call (Unauthenticated): the bearer token is wrong"),
        "{err}"
    );
}

#[test]
fn a_failing_rank_stops_the_others_and_sets_the_exit_code() {
    let start = Instant::now();
    // Debug logs name every rank's pid, including ranks stopped before they print theirs.
    let proc = Proc::spawn(
        Command::new(DROVE)
            .args(["run", "--np", "3", "--stop-grace-secs", "2", "--", DROVE, "check", "--print-pid"])
            .args(["--fail-with", "3", "--rank-to-fail", "1"])
            .env("RUST_LOG", "drove_launch=debug"),
    );
    let (status, out, err) = proc.finish(Duration::from_secs(30));
    assert_eq!(status.code(), Some(3), "{status}\n{err}");
    // The others would wait 60 s for rank 1 in the rendezvous: the launcher stopped them.
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(err.contains("[1] rank 1: exiting with code 3 on purpose"), "{err}");
    assert!(err.contains("rank 1 exited with code 3"), "{err}");
    // Ranks 0 and 2 were waiting for rank 1: the launcher's SIGTERM ended them. A rank whose
    // SIGTERM lands after a peer's may see that peer's socket reset first and exit with an
    // error of its own; either way it was stopped, never left to wait out the rendezvous.
    for rank in [0, 2] {
        let killed = format!("rank {rank} was killed by SIGTERM");
        let failed = format!("rank {rank} exited with code");
        assert!(err.contains(&killed) || err.contains(&failed), "rank {rank} in {err}");
    }
    assert!(err.contains("was killed by SIGTERM"), "no rank was stopped by the launcher in {err}");
    let pids = logged_pids(&err);
    assert_eq!(pids.len(), 3, "one pid per rank in {err}");
    for line in &out {
        let (_, text) = &by_rank(std::slice::from_ref(line))[0];
        let pid: i32 = text.strip_prefix("pid ").unwrap_or_else(|| panic!("{line}")).parse().unwrap();
        assert!(pids.contains(&pid), "{pid} not in {pids:?}");
    }
    for pid in pids {
        assert!(!exists(pid), "rank pid {pid} outlived drove run");
    }
}

#[test]
fn ranks_that_ignore_sigterm_are_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("go");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    // Every rank ignores SIGTERM; rank 1 exits with 5 once the test says so.
    let script = r#"trap "" TERM; echo "pid $$"; if [ "$DROVE_RANK" = 1 ]; then read x < "$GO"; exit 5; fi; exec sleep 1000"#;
    let mut proc = Proc::spawn(
        Command::new(DROVE)
            .args(["run", "--np", "3", "--stop-grace-secs", "1", "--", "sh", "-c", script])
            .env("GO", &fifo)
            .env_remove("RUST_LOG"),
    );
    let mut pids = Vec::new();
    for _ in 0..3 {
        let line = proc.line(DEADLINE, |l| l.contains("] pid "));
        pids.push(line.rsplit(' ').next().unwrap().parse::<i32>().unwrap());
    }
    // Every rank has set its trap: let rank 1 fail.
    let writer = std::thread::spawn(move || std::fs::write(fifo, "go\n"));
    let failed_at = Instant::now();
    let (status, _, err) = proc.finish(DEADLINE);
    writer.join().unwrap().unwrap();
    assert_eq!(status.code(), Some(5), "{status}\n{err}");
    assert!(failed_at.elapsed() >= Duration::from_secs(1), "SIGKILL came before the grace period ended");
    assert!(err.contains("sending SIGKILL"), "{err}");
    assert!(
        err.contains("rank 0 was killed by SIGKILL") && err.contains("rank 2 was killed by SIGKILL"),
        "{err}"
    );
    for pid in pids {
        assert!(!exists(pid), "rank pid {pid} outlived drove run");
    }
}

#[test]
fn sigterm_to_run_stops_every_rank() {
    let script = r#"echo "pid $$"; exec sleep 1000"#;
    let mut proc = Proc::drove(&["run", "--np", "2", "--stop-grace-secs", "5", "--", "sh", "-c", script]);
    let mut pids = Vec::new();
    for _ in 0..2 {
        let line = proc.line(DEADLINE, |l| l.contains("] pid "));
        pids.push(line.rsplit(' ').next().unwrap().parse::<i32>().unwrap());
    }
    proc.signal(libc::SIGTERM);
    let (status, _, err) = proc.finish(DEADLINE);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}\n{err}");
    assert!(err.contains("received SIGTERM"), "{err}");
    for pid in pids {
        assert!(!exists(pid), "rank pid {pid} outlived drove run");
    }
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let (status, out, err) = drove(&["run", "--np", "2", "--", "/nonexistent/program"], DEADLINE);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(out.is_empty(), "{out:?}");
    assert!(err.contains("cannot start rank 0: /nonexistent/program"), "{err}");
}

#[test]
fn run_on_a_separate_coordinator_is_listed_finished_or_failed() {
    let coordinator = Coordinator::start(&[]);
    let addr = coordinator.addr.as_str();
    let (status, out, err) =
        drove(&["run", "--np", "2", "--coordinator", addr, "--run-id", "t1", "--", DROVE, "check"], DEADLINE);
    assert!(status.success(), "{status}\n{err}");
    assert_eq!(by_rank(&out).len(), 2, "{out:?}");
    assert!(err.contains(&format!("coordinator={addr}")), "{err}");

    let (status, _, err) = drove(
        &[
            "run",
            "--np",
            "2",
            "--coordinator",
            addr,
            "--run-id",
            "t2",
            "--stop-grace-secs",
            "2",
            "--",
            DROVE,
            "check",
            "--fail-with",
            "4",
            "--rank-to-fail",
            "0",
        ],
        DEADLINE,
    );
    assert_eq!(status.code(), Some(4), "{status}\n{err}");

    let (status, out, err) = drove(&["runs", "--coordinator", addr, "--json"], DEADLINE);
    assert!(status.success(), "{err}");
    assert_eq!(out.len(), 1, "{out:?}");
    let report: Value = serde_json::from_str(&out[0]).unwrap();
    let runs = report["runs"].as_array().expect("runs");
    let run =
        |id: &str| runs.iter().find(|r| r["run_id"] == id).unwrap_or_else(|| panic!("{id} in {report}"));
    assert_eq!(run("t1")["state"], "finished", "{report}");
    assert_eq!(run("t1")["world_size"], 2);
    assert_eq!(run("t1")["joined"], 2);
    assert_eq!(run("t2")["state"], "failed", "{report}");

    let (status, out, err) = drove(&["runs", "--coordinator", addr], DEADLINE);
    assert!(status.success(), "{err}");
    assert!(out[0].starts_with("run id"), "{out:?}");
    assert!(out.iter().any(|l| l.starts_with("t1 ") && l.contains(" finished ")), "{out:?}");
}

/// A join of member `id` to elastic run `e` of 2 to 3 members, re-joining
/// after generation `after` for `cause` if one is given.
fn elastic_join(id: &str, after: i64, cause: Option<&GenerationEnd>) -> JoinRequest {
    JoinRequest {
        run_id: "e".into(),
        address: format!("127.0.0.1:{}", 29500 + id.as_bytes()[0] as u16),
        host: format!("host-{id}"),
        requested_rank: -1,
        timeout_ms: DEADLINE.as_millis() as i64,
        member_id: id.into(),
        min_size: 2,
        max_size: 3,
        settle_ms: 200,
        after_generation: after,
        step: if after > 0 { 42 } else { 0 },
        cause: cause.cloned(),
        ..Default::default()
    }
}

/// Elastic run `e`: generation 1 of members a, b and c (at its maximum, it
/// closes at once); c's connection closes at step 42, and a and b re-form
/// generation 2 without it. Fixed run `f`: one worker.
async fn elastic_and_fixed_runs(addr: &str) {
    let c = Clients::connect(addr, None).await.unwrap();
    let join = |req: JoinRequest| {
        let mut r = c.rendezvous.clone();
        async move { tokio::time::timeout(DEADLINE, r.join(req)).await.expect("in time").expect("joined") }
    };
    futures::future::join_all(["a", "b", "c"].map(|id| join(elastic_join(id, 0, None)))).await;
    let cause = GenerationEnd {
        kind: EndKind::ClosedConnection.into(),
        members: vec!["c".into()],
        detail: "peer closed the connection".into(),
    };
    futures::future::join_all(["a", "b"].map(|id| join(elastic_join(id, 1, Some(&cause))))).await;
    let fixed = JoinRequest {
        run_id: "f".into(),
        world_size: 1,
        address: "127.0.0.1:29600".into(),
        host: "h".into(),
        requested_rank: 0,
        timeout_ms: 10_000,
        ..Default::default()
    };
    join(fixed).await;
}

/// `drove runs --json` with `args`, parsed, and its runs by id.
fn runs_json(args: &[&str]) -> Value {
    let mut all = vec!["runs", "--json"];
    all.extend_from_slice(args);
    let (status, out, err) = drove(&all, DEADLINE);
    assert!(status.success(), "{all:?}: {err}");
    assert_eq!(out.len(), 1, "{out:?}");
    let report: Value = serde_json::from_str(&out[0]).unwrap();
    let runs = report["runs"].as_array().expect("runs").iter();
    runs.map(|r| (r["run_id"].as_str().unwrap().to_string(), r.clone())).collect()
}

#[test]
fn runs_lists_the_generations_of_an_elastic_run_live_and_from_its_store() {
    let store = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: store.path().to_path_buf(),
        ..Default::default()
    };
    let server = rt.block_on(drove_coordinator::start(&config)).unwrap();
    let addr = server.addr().to_string();
    rt.block_on(elastic_and_fixed_runs(&addr));

    let live = runs_json(&["--coordinator", &addr]);
    assert_eq!(live["f"]["generations"], serde_json::json!([]), "a fixed world has none: {live}");
    let gens = live["e"]["generations"].as_array().expect("generations");
    assert_eq!(gens.len(), 2, "{live}");
    let (g1, g2) = (&gens[0], &gens[1]);
    assert_eq!((&g1["number"], &g1["state"], &g1["world_size"]), (&1.into(), &"ended".into(), &3.into()));
    assert_eq!((&g1["first_step"], &g1["last_step"]), (&0.into(), &42.into()), "{g1}");
    let end = serde_json::json!({
        "kind": "closed-connection", "members": ["c"], "detail": "peer closed the connection"
    });
    assert_eq!(g1["end"], end, "{g1}");
    assert_eq!((&g2["number"], &g2["state"], &g2["world_size"]), (&2.into(), &"running".into(), &2.into()));
    assert_eq!((&g2["first_step"], &g2["end"]), (&42.into(), &Value::Null), "{g2}");
    let mut members: Vec<(String, i64, String)> = g2["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (m["member_id"].as_str().unwrap().into(), m["rank"].as_i64().unwrap(), m["host"].to_string())
        })
        .collect();
    members.sort();
    assert_eq!(members.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(), ["a", "b"], "{g2}");
    assert!(members.iter().all(|m| m.1 == 0 || m.1 == 1) && members[0].1 != members[1].1, "{g2}");

    let (status, out, err) = drove(&["runs", "--coordinator", &addr], DEADLINE);
    assert!(status.success(), "{err}");
    let at = out.iter().position(|l| l.starts_with("e ")).unwrap_or_else(|| panic!("{out:?}"));
    let under: Vec<&str> =
        out[at + 1..].iter().map(String::as_str).take_while(|l| l.starts_with(' ')).collect();
    assert!(under[0].starts_with("    generation 1  ended  world 3  steps 0..42  started "), "{under:?}");
    assert!(under[1].starts_with("      members: ") && under[1].contains("c (rank "), "{under:?}");
    assert_eq!(under[2], "      ended by closed-connection (lost: c): peer closed the connection");
    assert!(under[3].starts_with("    generation 2  running  world 2  steps 42..  started "), "{under:?}");
    assert!(under[4].contains("a (rank ") && under[4].contains(", host-b)"), "{under:?}");
    let fixed = out.iter().position(|l| l.starts_with("f ")).unwrap();
    assert!(out.get(fixed + 1).is_none_or(|l| !l.starts_with(' ')), "a fixed world lists none: {out:?}");

    rt.block_on(server.shutdown());
    let stored = runs_json(&["--store", store.path().to_str().unwrap()]);
    assert_eq!(stored["e"]["generations"], live["e"]["generations"], "the store holds the same");
    assert_eq!(stored["f"]["generations"], serde_json::json!([]));
}

fn push(addr: &str, token: &str, points: Vec<MetricPoint>) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = Clients::connect(addr, Some(token)).await.unwrap();
        let n = points.len() as u64;
        let stream = futures::stream::iter([PushRequest { points }]);
        let mut acks = c.metrics.push(stream).await.unwrap().into_inner();
        let mut stored = 0;
        while let Some(ack) = tokio::time::timeout(DEADLINE, acks.message()).await.unwrap().unwrap() {
            stored = ack.stored;
        }
        assert_eq!(stored, n);
    });
}

fn point(rank: i32, step: f64, name: &str, value: f64) -> MetricPoint {
    MetricPoint { run_id: "m1".into(), rank, step, name: name.into(), value, wall_time_unix_ms: 1_000 }
}

fn metrics_json(addr: &str, extra: &[&str]) -> Value {
    let mut args = vec!["metrics", "--coordinator", addr, "--token", "s3cret", "--run", "m1", "--json"];
    args.extend_from_slice(extra);
    let (status, out, err) = drove(&args, DEADLINE);
    assert!(status.success(), "{args:?}: {err}");
    assert_eq!(out.len(), 1, "{out:?}");
    serde_json::from_str(&out[0]).unwrap()
}

#[allow(clippy::too_many_lines)] // tests are exempt: one scenario, read top to bottom
#[test]
fn metrics_are_queried_aggregated_or_raw_and_watched() {
    let coordinator = Coordinator::start(&["--token", "s3cret"]);
    let addr = coordinator.addr.as_str();
    let mut points = Vec::new();
    for step in 0..3 {
        points.push(point(0, step as f64, "loss", 1.0 + step as f64));
        points.push(point(1, step as f64, "loss", 3.0 + step as f64));
        points.push(point(0, step as f64, "acc", 0.5));
    }
    push(addr, "s3cret", points);

    let mean = metrics_json(addr, &["--name", "loss", "--agg", "mean"]);
    assert_eq!(mean["run"], "m1");
    let rows = mean["points"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{mean}");
    for (step, row) in rows.iter().enumerate() {
        assert_eq!(row["name"], "loss");
        assert_eq!(row["step"].as_f64(), Some(step as f64));
        assert_eq!(row["value"].as_f64(), Some(2.0 + step as f64), "{row}");
        assert_eq!(row["count"], 2);
        assert!(row["rank"].is_null(), "{row}");
    }
    // Mean is the default.
    assert_eq!(metrics_json(addr, &["--name", "loss"])["points"], mean["points"]);

    let raw = metrics_json(addr, &["--name", "loss", "--agg", "raw"]);
    let rows = raw["points"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{raw}");
    for row in rows {
        let (rank, step) = (row["rank"].as_i64().unwrap(), row["step"].as_f64().unwrap());
        assert_eq!(row["value"].as_f64(), Some(1.0 + 2.0 * rank as f64 + step), "{row}");
        assert_eq!(row["count"], 1);
        assert_eq!(row["wall_time_unix_ms"], 1_000);
    }

    let max = metrics_json(addr, &["--name", "loss", "--agg", "max", "--min-step", "1", "--max-step", "1"]);
    assert_eq!(max["points"].as_array().unwrap().len(), 1, "{max}");
    assert_eq!(max["points"][0]["value"].as_f64(), Some(4.0));
    let every = metrics_json(addr, &["--agg", "count"]);
    assert_eq!(every["points"].as_array().unwrap().len(), 6, "both metrics: {every}");

    let (status, out, err) = drove(
        &[
            "metrics",
            "--coordinator",
            addr,
            "--token",
            "s3cret",
            "--run",
            "m1",
            "--name",
            "loss",
            "--agg",
            "raw",
        ],
        DEADLINE,
    );
    assert!(status.success(), "{err}");
    assert!(out[0].contains("step") && out[0].contains("rank"), "{out:?}");
    assert_eq!(out.len(), 7, "header and six points: {out:?}");

    // A wrong token is a one-line error naming the status code.
    let (status, out, err) = drove(&["runs", "--coordinator", addr, "--token", "wrong"], DEADLINE);
    assert_eq!(status.code(), Some(1));
    assert!(out.is_empty());
    assert_eq!(err, "error: the coordinator refused the call (Unauthenticated): the bearer token is wrong");

    // Watch: the stored points, then new ones as they arrive, until SIGINT.
    let mut watch = Proc::drove(&[
        "metrics",
        "--coordinator",
        addr,
        "--token",
        "s3cret",
        "--run",
        "m1",
        "--name",
        "loss",
        "--watch",
        "--json",
    ]);
    for _ in 0..6 {
        let line = watch.line(DEADLINE, |_| true);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["name"], "loss", "{line}");
    }
    push(addr, "s3cret", vec![point(1, 7.0, "acc", 0.9), point(1, 7.0, "loss", 42.0)]);
    let line = watch.line(DEADLINE, |_| true);
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (v["rank"].as_i64(), v["step"].as_f64(), v["value"].as_f64()),
        (Some(1), Some(7.0), Some(42.0))
    );
    assert_eq!(v["run"], "m1");
    watch.signal(libc::SIGINT);
    let (status, out, err) = watch.finish(DEADLINE);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out.len(), 7, "the acc point is filtered out: {out:?}");
}

#[test]
fn metrics_without_a_reachable_coordinator_say_so() {
    // A port nothing listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let (status, out, err) = drove(&["runs", "--coordinator", &addr], DEADLINE);
    assert_eq!(status.code(), Some(1));
    assert!(out.is_empty());
    assert!(err.starts_with(&format!("error: cannot connect to the coordinator at {addr}")), "{err}");
}

#[test]
fn health_says_serving_only_for_a_serving_coordinator() {
    let coordinator = Coordinator::start(&["--token", "secret"]);
    let addr = coordinator.addr.as_str();
    // No token needed: probes and container health checks carry none.
    let (status, out, err) = drove(&["health", "--coordinator", addr], DEADLINE);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(out, [format!("{addr}: the coordinator is SERVING")]);
    let (status, _, err) =
        drove(&["health", "--coordinator", addr, "--service", "no.such.Service"], DEADLINE);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("NotFound"), "{err}");
    drop(coordinator);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gone = format!("127.0.0.1:{port}");
    let (status, _, err) = drove(&["health", "--coordinator", &gone, "--timeout", "3"], DEADLINE);
    assert_eq!(status.code(), Some(1));
    assert!(err.starts_with(&format!("error: cannot connect to the coordinator at {gone}")), "{err}");
    let (status, _, err) = drove(&["health", "--coordinator", &gone, "--timeout", "0"], DEADLINE);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("a timeout must be above 0 seconds"), "{err}");
}

#[test]
fn bench_coordinator_reports_positive_finite_figures() {
    let (status, out, err) = drove(
        &[
            "bench",
            "coordinator",
            "--json",
            "--workers",
            "16",
            "--streams",
            "2",
            "--points",
            "20000",
            "--blob-mib",
            "8",
            "--fetchers",
            "2",
        ],
        Duration::from_secs(120),
    );
    assert!(status.success(), "{status}\n{err}");
    assert_eq!(out.len(), 1, "{out:?}");
    let r: Value = serde_json::from_str(&out[0]).unwrap();
    for (section, key) in [
        ("rendezvous", "seconds"),
        ("rendezvous", "joins_per_s"),
        ("metrics_ingest", "seconds"),
        ("metrics_ingest", "points_per_s"),
        ("blob", "publish_gbps"),
        ("blob", "fetch_gbps_min"),
        ("blob", "fetch_gbps_mean"),
        ("blob", "fetch_wall_seconds"),
        ("baseline", "sha256_gbps"),
        ("baseline", "memcpy_gbps"),
        ("ratios", "fetch_mean_vs_sha256"),
    ] {
        let x = r[section][key].as_f64().unwrap_or_else(|| panic!("{section}.{key} in {r}"));
        assert!(x.is_finite() && x > 0.0, "{section}.{key} = {x}");
    }
    assert_eq!(r["rendezvous"]["workers"], 16);
    assert_eq!(r["metrics_ingest"]["points"], 20000);
    assert_eq!(r["blob"]["bytes"], 8 << 20);
    assert_eq!(r["blob"]["fetchers"], 2);
    assert_eq!(r["blob"]["verified"], true);
    assert!(r["blob"]["fetch_gbps_min"].as_f64() <= r["blob"]["fetch_gbps_mean"].as_f64());
    assert!(r["machine"]["nproc"].as_u64().is_some_and(|n| n >= 1), "{r}");
}

#[test]
fn an_elastic_launch_of_real_trainers_left_below_min_np_ends_soon_after_the_loss_naming_why() {
    // Real `drove train ner` ranks on MiniLM: the survivors are in a
    // collective when their peer dies, and would wait for a world of 3 to
    // re-form (before the launcher stopped them, 140-150 s).
    let dir = tempfile::tempdir().unwrap();
    let a = crate::common::assets();
    let mut cmd = Command::new(DROVE);
    cmd.args(["run", "--np", "3", "--min-np", "3", "--stop-grace-secs", "2", "--", DROVE, "train", "ner"])
        .args(["--max-train-sentences", "16", "--batch-size", "2", "--epochs", "1", "--eval", ""])
        .args(["--workers", "1", "--log-every", "1", "--fail-at-step", "1", "--rank-to-fail", "2"])
        .arg(format!("--data={}", a.join("conll2003").display()))
        .arg(format!("--model={}", a.join("minilm").display()))
        .arg(format!("--out={}", dir.path().join("out").display()))
        .env_remove("RUST_LOG")
        .env("RAYON_NUM_THREADS", "1");
    let mut run = Proc::spawn(&mut cmd);
    let killed = "[2] rank 2: killing itself with SIGKILL after step 1";
    assert!(
        run.stderr_until(Duration::from_secs(600), |l| l.contains(killed)),
        "rank 2 never failed:\n{}",
        run.err.join("\n")
    );
    let lost = Instant::now();
    // Generous for a loaded machine, and well under the wait it once was;
    // `finish` prints everything the launcher said if it is not over by then.
    let (status, _, err) = run.finish(Duration::from_secs(60));
    eprintln!("drove run ended {:.1} s after rank 2 was lost", lost.elapsed().as_secs_f64());
    assert_eq!(status.code(), Some(128 + libc::SIGKILL), "rank 2's exit code: {status}\n{err}");
    assert!(
        err.contains("rank 2 failed (exit code 137) with no restart left, and only 2 rank(s) could still finish, fewer than --min-np 3"),
        "{err}"
    );
}

//! Elastic runs (`drove train ner --world MIN:MAX`): real `drove-coordinator`
//! and `drove` processes on loopback, MiniLM on a slice of CoNLL-2003.
//!
//! Four members start; the fourth SIGKILLs itself after step 10. The other
//! three re-form at world 3 and finish with exit 0: the samples trace shows
//! every position of the epoch applied exactly once, the (sample, mask hash)
//! pairs equal those of the same run uninterrupted, and test F1 is within
//! one point of it. The coordinator lists the two generations, the first
//! ended by the lost member's closed connection. A rank killed in the middle
//! of a step's backward pass (`--fail-in-backward`, while the overlapped
//! all-reduce has buckets in flight) is named with the bucket it was lost in,
//! and in an elastic run costs that one step, redone by the next world.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::common::{
    DROVE, Proc, assert_each_once, assets, coordinator, free_port, launch_env_removed, tiny_training, traced,
};

/// How long one run may take here.
const DEADLINE: Duration = Duration::from_secs(400);
/// Sentences of the tiny model's run a member is stopped in: hundreds of steps.
const SLOW: usize = 1200;
/// Sentences of the tiny model's runs a member joins: long enough (400 steps
/// of 2 ranks, over ten seconds here) for a process to start and enter it.
const LONG: usize = 1600;
/// Training sentences: 10 steps of 4 ranks x 2 rows, then 14 of 3 x 2 (the last one padded).
const SENTENCES: usize = 160;

/// One member of run `run_id`: `drove train ner --world 3:4`, killing itself
/// after step 10 if `fail`.
fn member(addr: &str, run_id: &str, id: usize, dir: &Path, fail: bool) -> Proc {
    let a = assets();
    let mut cmd = Command::new(DROVE);
    cmd.args(["train", "ner", "--world", "3:4", "--batch-size", "2", "--epochs", "1"])
        .args(["--max-train-sentences", &SENTENCES.to_string(), "--eval", "test", "--max-eval-sentences"])
        .args(["200", "--workers", "1", "--log-every", "1", "--dropout", "0", "--json", "--data"])
        .arg(a.join("conll2003"))
        .arg("--model")
        .arg(a.join("minilm"))
        .arg("--out")
        .arg(dir.join(format!("out-{id}")))
        .arg("--trace-samples")
        .arg(dir.join("trace.jsonl"))
        .env("DROVE_COORDINATOR", addr)
        .env("DROVE_RUN_ID", run_id)
        .env("DROVE_MEMBER_ID", format!("m{id}"))
        .env("RUST_LOG", "warn");
    if fail {
        // The fourth to join is rank 3 of generation 1.
        cmd.args(["--fail-at-step", "10", "--rank-to-fail", "3"]);
    }
    Proc::spawn(&mut cmd)
}

/// What a run left: each member's exit, the summary rank 0 printed, and the
/// trace's (sample, mask hash) pairs with how often each sample was applied.
struct Outcome {
    exits: Vec<ExitStatus>,
    summary: serde_json::Value,
    pairs: BTreeMap<usize, u64>,
    applied: BTreeMap<usize, usize>,
    generations: Vec<(u64, usize)>,
    stderr: String,
}

fn run(dir: &Path, run_id: &str, fail: bool) -> Outcome {
    let (_coordinator, addr) = serve(dir);
    let members: Vec<Proc> = (0..4).map(|id| member(&addr, run_id, id, dir, fail)).collect();
    let (mut exits, mut summary, mut stderr) = (Vec::new(), serde_json::Value::Null, String::new());
    for m in members {
        let (status, out, err) = m.finish(DEADLINE);
        exits.push(status);
        stderr.push_str(&err);
        if let Some(json) = out.iter().find(|l| l.starts_with('{')) {
            summary = serde_json::from_str(json).expect("the summary is JSON");
        }
    }
    let (mut pairs, mut applied, mut generations) = (BTreeMap::new(), BTreeMap::new(), Vec::new());
    let trace = std::fs::read_to_string(dir.join("trace.jsonl")).expect("the trace was written");
    for line in trace.lines() {
        let line: drove_ner::TraceLine = serde_json::from_str(line).expect("a trace line");
        generations.push((line.generation, line.world));
        for (sample, hash) in line.samples {
            *applied.entry(sample).or_insert(0) += 1;
            pairs.insert(sample, hash);
        }
    }
    generations.sort_unstable();
    generations.dedup();
    Outcome { exits, summary, pairs, applied, generations, stderr }
}

#[test]
fn a_rank_killed_at_step_10_costs_one_step_and_the_others_finish_at_world_3() {
    let (whole, killed) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let reference = run(whole.path(), "whole", false);
    assert!(reference.exits.iter().all(ExitStatus::success), "{}", reference.stderr);
    assert_eq!(reference.generations, [(1, 4)], "one world of 4 throughout");

    let outcome = run(killed.path(), "killed", true);
    let failed: Vec<_> = outcome.exits.iter().filter(|s| !s.success()).collect();
    assert_eq!(failed.len(), 1, "only the killed member fails: {:?}\n{}", outcome.exits, outcome.stderr);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(failed[0]),
        Some(libc::SIGKILL),
        "{}",
        outcome.stderr
    );
    assert_eq!(outcome.generations, [(1, 4), (2, 3)], "steps at world 4, then at world 3");
    // Every position of the epoch applied exactly once, across the re-form.
    assert_each_once(&outcome.applied, SENTENCES);
    // Per-sample streams: the same masks whichever rank of whichever world drew them.
    assert_eq!(outcome.pairs, reference.pairs, "(sample, mask hash) pairs of the uninterrupted run");
    let f1 =
        |o: &Outcome| o.summary["test_f1"].as_f64().unwrap_or_else(|| panic!("no test F1: {}", o.summary));
    let (f_ref, f_killed) = (f1(&reference), f1(&outcome));
    assert!((f_ref - f_killed).abs() <= 0.01, "test F1 {f_killed} vs {f_ref} uninterrupted");
    assert_eq!(outcome.summary["world_size"], 3, "{}", outcome.summary);
    assert!(
        outcome.stderr.contains("generation 2: rank 0 of 3 from step 10"),
        "the new world starts from the last applied step:\n{}",
        outcome.stderr
    );
}

/// `drove run ... -- drove train ner` of an elastic fine-tune of the tiny
/// model (no evaluation), `sentences` sentences in batches of 2, tracing its samples.
fn launch(launcher: &[&str], sentences: usize, dir: &Path, rank_args: &[&str]) -> Proc {
    let mut cmd = Command::new(DROVE);
    cmd.arg("run")
        .args(launcher)
        .args(["--stop-grace-secs", "2", "--"])
        .arg(DROVE)
        .args(tiny_training(dir, sentences, &dir.join("out")))
        .args(["--reform-check-every", "2"])
        .args(rank_args)
        .env("RUST_LOG", "warn");
    Proc::spawn(&mut cmd)
}

/// Each member's "generation G: this member is rank R of W at step S, state F"
/// lines for generation `generation`: (rank, world, step, fingerprint).
fn joined(stderr: &str, generation: u64) -> Vec<(usize, usize, u64, String)> {
    let want = format!("generation {generation}: this member is rank ");
    let mut seen: Vec<_> = stderr
        .lines()
        .filter_map(|l| l.split_once(&want).map(|(_, rest)| rest.to_string()))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            // "R of W at step S, state F"
            let number = |i: usize| words[i].trim_end_matches(',').parse::<u64>().expect("a number");
            (number(0) as usize, number(2) as usize, number(5), words[7].to_string())
        })
        .collect();
    seen.sort();
    seen
}

/// Waits for rank 0's line `step N/` on `run`'s stderr.
fn wait_for_step(run: &mut Proc, step: u64) {
    let want = format!("[0] step {step}/");
    assert!(run.stderr_until(DEADLINE, |l| l.starts_with(&want)), "no {want:?}:\n{}", run.err.join("\n"));
}

/// A coordinator on a free port with its store under `dir`, and its address.
fn serve(dir: &Path) -> (Proc, String) {
    let port = free_port();
    (coordinator(port, &dir.join("store"), &[]), format!("127.0.0.1:{port}"))
}

#[test]
fn under_drove_run_a_failed_slot_starts_again_alone_and_joins_the_running_world() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let launcher = ["--np", "4", "--min-np", "3", "--max-restarts", "1", "--store", store.to_str().unwrap()];
    let run = launch(&launcher, LONG, dir.path(), &["--fail-at-step", "5", "--rank-to-fail", "3"]);
    let (status, _, stderr) = run.finish(DEADLINE);
    assert!(status.success(), "the survivors and the restarted slot finish the run:\n{stderr}");
    let (worlds, applied) = traced(dir.path());
    // 4, then 3 without the slot, then 4 again; or, when the slot started
    // again before the others' world closed, 4 again at once.
    let last = *worlds.last().expect("a world");
    assert!(
        worlds == [(1, 4), (2, 3), (3, 4)] || worlds == [(1, 4), (2, 4)],
        "4, then 4 again with the restarted slot: {worlds:?}\n{stderr}"
    );
    assert_each_once(&applied, LONG);
    // Right after the join every member holds the same state, at one step.
    let members = joined(&stderr, last.0);
    assert_eq!(
        members.iter().map(|m| (m.0, m.1)).collect::<Vec<_>>(),
        [(0, 4), (1, 4), (2, 4), (3, 4)],
        "{stderr}"
    );
    assert!(members.iter().all(|m| m.2 == members[0].2 && m.3 == members[0].3), "{members:?}");
    assert!(members[0].2 >= 5, "the slot joined after the step it failed at: {members:?}");
}

#[test]
fn a_run_of_2_grows_to_4_when_a_second_drove_run_adds_two() {
    let dir = tempfile::tempdir().unwrap();
    let (_coordinator, addr) = serve(dir.path());
    let launcher =
        ["--np", "2", "--min-np", "2", "--max-np", "4", "--coordinator", &addr, "--run-id", "grow"];
    let mut first = launch(&launcher, LONG, dir.path(), &[]);
    wait_for_step(&mut first, 3);
    let second = launch(&launcher, LONG, dir.path(), &[]);
    let (status, _, stderr) = second.finish(DEADLINE);
    assert!(status.success(), "the added ranks finish with the run:\n{stderr}");
    let (status, _, first_err) = first.finish(DEADLINE);
    assert!(status.success(), "{first_err}");
    let (worlds, applied) = traced(dir.path());
    assert_eq!(worlds, [(1, 2), (2, 4)], "2 ranks, then 4 from a step boundary on");
    assert_each_once(&applied, LONG);
    let all = format!("{first_err}\n{stderr}");
    let members = joined(&all, 2);
    assert_eq!(members.len(), 4, "{all}");
    assert!(members.iter().all(|m| m.1 == 4 && m.2 == members[0].2 && m.3 == members[0].3), "{members:?}");
}

/// Member `id` of an elastic run of `world` sizes, with `env` set: a
/// fine-tune of `sentences` sentences of a tiny random model without evaluation.
fn small_member(run: &Small<'_>, id: usize, env: &[(&str, &str)], extra: &[&str]) -> Proc {
    let mut cmd = Command::new(DROVE);
    cmd.args(tiny_training(run.dir, run.sentences, &run.dir.join("out")))
        .args(["--world", run.world])
        .args(extra)
        .env("DROVE_COORDINATOR", run.addr)
        .env("DROVE_RUN_ID", run.run_id)
        .env("DROVE_MEMBER_ID", format!("m{id}"))
        .env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn(&mut cmd)
}

/// An elastic run of tiny members: where, its id, its sizes and length.
struct Small<'a> {
    addr: &'a str,
    run_id: &'a str,
    dir: &'a Path,
    world: &'a str,
    sentences: usize,
}

/// Waits for a stderr line of `p` containing `what`; returns whether it came.
fn stderr_line(p: &mut Proc, what: &str) -> bool {
    p.stderr_until(DEADLINE, |l| l.contains(what))
}

#[test]
fn a_stopped_member_is_left_out_and_told_so_when_it_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (_coordinator, addr) = serve(dir.path());
    // A collective waits 4 s for a silent peer.
    let env = [("DROVE_COMM_TIMEOUT", "4")];
    // Long enough that the others are still training when the stopped one resumes.
    let run = Small { addr: &addr, run_id: "stop", dir: dir.path(), world: "2:3", sentences: SLOW };
    let mut members: Vec<Proc> = (0..3).map(|id| small_member(&run, id, &env, &[])).collect();
    // Each member says its rank in the first world; rank 0 prints the steps.
    let ranks: Vec<usize> = members
        .iter_mut()
        .map(|m| {
            assert!(stderr_line(m, "generation 1: this member is rank "), "{}", m.stderr_now());
            let line = m.err.last().unwrap().clone();
            let rest = line.split("this member is rank ").nth(1).unwrap();
            rest.split_whitespace().next().unwrap().parse().unwrap()
        })
        .collect();
    let printer = ranks.iter().position(|&r| r == 0).expect("a rank 0");
    assert!(stderr_line(&mut members[printer], "step 5/"), "{}", members[printer].stderr_now());
    let stopped = (printer + 1) % 3;
    members[stopped].signal(libc::SIGSTOP);
    assert!(
        stderr_line(&mut members[printer], "generation 2: rank 0 of 2"),
        "the others re-form without the stopped member:\n{}",
        members[printer].stderr_now()
    );
    members[stopped].signal(libc::SIGCONT);
    let mut errs = String::new();
    for (i, m) in members.into_iter().enumerate() {
        let (status, _, err) = m.finish(DEADLINE);
        if i == stopped {
            assert!(!status.success(), "the stopped member fails:\n{err}");
            assert!(err.contains("left out of the run"), "it says it was left out:\n{err}");
        } else {
            assert!(status.success(), "member {i}: the new world is unharmed:\n{err}");
        }
        errs.push_str(&err);
    }
    let (worlds, applied) = traced(dir.path());
    assert_eq!(worlds, [(1, 3), (2, 2)], "{errs}");
    assert_each_once(&applied, SLOW);
}

#[test]
fn a_member_slow_past_the_collective_deadline_but_still_beating_is_waited_for_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (_coordinator, addr) = serve(dir.path());
    // A collective's deadline is 2 s; rank 1 stops for 8 s after step 3, its
    // heartbeats going on (as a member starved of CPU does).
    let env = [("DROVE_COMM_TIMEOUT", "2")];
    let stall = ["--stall-at-step", "3", "--rank-to-stall", "1", "--stall-secs", "8"];
    let run = Small { addr: &addr, run_id: "slow", dir: dir.path(), world: "3:3", sentences: SENTENCES };
    let members: Vec<Proc> = (0..3).map(|id| small_member(&run, id, &env, &stall)).collect();
    let mut errs = String::new();
    for (i, m) in members.into_iter().enumerate() {
        let (status, _, err) = m.finish(DEADLINE);
        assert!(status.success(), "member {i} finishes:\n{err}");
        errs.push_str(&err);
    }
    assert!(errs.contains("(--stall-at-step)"), "a member stopped:\n{errs}");
    assert!(
        errs.contains("still alive (heartbeats), waiting for them up to the hang limit"),
        "the others said whom they waited for:\n{errs}"
    );
    let (worlds, applied) = traced(dir.path());
    assert_eq!(worlds, [(1, 3)], "one world, nobody lost:\n{errs}");
    assert_each_once(&applied, SENTENCES);
}

#[test]
fn below_min_the_run_fails_naming_the_lost_member_with_a_readable_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (_coordinator, addr) = serve(dir.path());
    // The next world is waited for 3 s; rank 1 kills itself after step 5.
    let env = [("DROVE_RENDEZVOUS_TIMEOUT_SECS", "3")];
    let fail = ["--fail-at-step", "5", "--rank-to-fail", "1"];
    let run = Small { addr: &addr, run_id: "below", dir: dir.path(), world: "2:2", sentences: 160 };
    let members: Vec<Proc> = (0..2).map(|id| small_member(&run, id, &env, &fail)).collect();
    let outcomes: Vec<_> = members.into_iter().map(|m| m.finish(DEADLINE)).collect();
    let is_killed = |o: &(ExitStatus, Vec<String>, String)| {
        std::os::unix::process::ExitStatusExt::signal(&o.0) == Some(libc::SIGKILL)
    };
    let killed: Vec<usize> = (0..2).filter(|&i| is_killed(&outcomes[i])).collect();
    assert_eq!(
        killed.len(),
        1,
        "one member killed itself: {:?}",
        outcomes.iter().map(|o| &o.2).collect::<Vec<_>>()
    );
    let (status, _, err) = &outcomes[1 - killed[0]];
    assert!(!status.success(), "below MIN the run fails:\n{err}");
    let lost = format!("m{}", killed[0]);
    assert!(err.contains("lost") && err.contains(&lost), "the error names the lost member {lost}:\n{err}");
    let root = dir.path().join("out/checkpoints");
    let latest = std::fs::read_to_string(root.join("latest")).expect("rank 0 wrote a checkpoint");
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join(latest.trim()).join("state.json")).unwrap()).unwrap();
    assert_eq!(state["global_step"], 5, "the last applied step: {state}");
    assert_eq!(state["position"], 20, "5 steps of 2 ranks x 2 rows: {state}");
    assert!(!crate::common::read_latest(&root).is_empty(), "its weights read back");
}

/// The generations of `run_id` as `drove runs --json` lists them live.
fn generations(addr: &str, run_id: &str) -> Vec<serde_json::Value> {
    let out = crate::common::run(Command::new(DROVE).args(["runs", "--json", "--coordinator", addr]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    let runs = report["runs"].as_array().cloned().unwrap_or_default();
    let run = runs.into_iter().find(|r| r["run_id"] == run_id);
    run.and_then(|r| r["generations"].as_array().cloned()).unwrap_or_default()
}

#[test]
fn a_coordinator_killed_while_the_world_re_forms_completes_the_re_form_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (port, store) = (free_port(), dir.path().join("store"));
    let coordinator_proc = coordinator(port, &store, &[]);
    let addr = format!("127.0.0.1:{port}");
    // A world of exactly 3: after m2 kills itself at step 5 the other two
    // wait in generation 2 for a replacement.
    let run = Small { addr: &addr, run_id: "restart", dir: dir.path(), world: "3:3", sentences: SLOW };
    let fail = ["--fail-at-step", "5", "--rank-to-fail", "2"];
    let survivors: Vec<Proc> = (0..2).map(|id| small_member(&run, id, &[], &fail)).collect();
    let lost = small_member(&run, 2, &[], &fail);
    let (status, _, err) = lost.finish(DEADLINE);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{err}");
    // The next generation forms with the two survivors in it (which number
    // it has depends on when m2's death was seen: see its stderr).
    let forming = |g: &[serde_json::Value]| {
        let newest = g.last().filter(|n| n["state"] == "forming");
        let mut ids: Vec<&str> = newest
            .and_then(|n| n["members"].as_array())
            .map(|m| m.iter().filter_map(|m| m["member_id"].as_str()).collect())
            .unwrap_or_default();
        ids.sort_unstable();
        ids == ["m0", "m1"]
    };
    let until = std::time::Instant::now() + DEADLINE;
    while !forming(&generations(&addr, "restart")) {
        assert!(
            std::time::Instant::now() < until,
            "no generation formed with the survivors: {:?}\nm2:\n{err}",
            generations(&addr, "restart")
        );
    }
    coordinator_proc.signal(libc::SIGKILL);
    let _ = coordinator_proc.finish(DEADLINE);
    let _restarted = coordinator(port, &store, &[]);
    let replacement = small_member(&run, 2, &[], &[]);
    let mut all = String::new();
    for (i, m) in survivors.into_iter().chain([replacement]).enumerate() {
        let (status, _, err) = m.finish(DEADLINE);
        assert!(status.success(), "member {i} finishes after the coordinator's restart:\n{err}");
        all.push_str(&err);
        all.push('\n');
    }
    let (worlds, applied) = traced(dir.path());
    let last = *worlds.last().expect("a world");
    assert!(
        worlds[0] == (1, 3) && last.1 == 3,
        "the re-form completed with the replacement: {worlds:?}\n{all}"
    );
    assert_each_once(&applied, SLOW);
    let members = joined(&all, last.0);
    assert_eq!(members.len(), 3, "{all}");
    assert!(members.iter().all(|m| m.2 == members[0].2 && m.3 == members[0].3), "{members:?}");
}

/// The op a member killed by `--fail-in-backward` says it was lost at
/// (`all_reduce "gradients.bucket3"`), from its stderr.
fn killed_at(stderr: &str) -> String {
    let line = stderr
        .lines()
        .find(|l| l.contains("(--fail-in-backward)"))
        .unwrap_or_else(|| panic!("no kill line:\n{stderr}"));
    let op = line.split(", at ").nth(1).and_then(|rest| rest.strip_suffix(" (--fail-in-backward)"));
    op.unwrap_or_else(|| panic!("no op in {line:?}")).to_string()
}

/// The steps each generation applied, from the trace under `dir`.
fn steps_by_generation(dir: &Path) -> BTreeMap<u64, Vec<u64>> {
    let mut steps: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let trace = std::fs::read_to_string(dir.join("trace.jsonl")).expect("the trace was written");
    for line in trace.lines() {
        let line: drove_ner::TraceLine = serde_json::from_str(line).expect("a trace line");
        steps.entry(line.generation).or_default().push(line.step);
    }
    steps.values_mut().for_each(|s| {
        s.sort_unstable();
        s.dedup();
    });
    steps
}

#[test]
fn a_rank_killed_in_the_middle_of_backward_is_named_with_the_bucket_it_was_lost_in() {
    // MiniLM, whose gradients make many buckets (the tiny model's make one
    // and its embedding's rows): two processes with torchrun's variables, no
    // launcher to stop the survivor first. Step 1 measures where the hooks
    // go; in step 2's overlapped backward rank 1 kills itself at its second
    // bucket, the first averaged on both ranks and the earlier layers' backward still to run.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let a = assets();
    let procs: Vec<Proc> = (0..2)
        .map(|rank: usize| {
            let mut cmd = launch_env_removed(Command::new(DROVE));
            cmd.args(["train", "ner", "--batch-size", "2", "--epochs", "1", "--eval", ""])
                .args(["--max-train-sentences", "16", "--workers", "1", "--log-every", "1", "--dropout", "0"])
                .arg("--data")
                .arg(a.join("conll2003"))
                .arg("--model")
                .arg(a.join("minilm"))
                .arg("--out")
                .arg(dir.path().join("out"))
                .arg("--trace-samples")
                .arg(dir.path().join("trace.jsonl"))
                .args(["--fail-in-backward", "2", "--rank-to-fail", "1"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port);
            Proc::spawn(&mut cmd)
        })
        .collect();
    let outcomes: Vec<_> = procs.into_iter().map(|p| p.finish(DEADLINE)).collect();
    let (victim, survivor) = (&outcomes[1], &outcomes[0]);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&victim.0),
        Some(libc::SIGKILL),
        "rank 1 killed itself:\n{}",
        victim.2
    );
    let op = killed_at(&victim.2);
    assert!(op.starts_with("all_reduce \"gradients.bucket"), "lost at a dense gradient bucket: {op}");
    assert!(victim.2.contains("in the backward pass of step 2"), "{}", victim.2);
    assert!(!survivor.0.success(), "a fixed world fails without its rank:\n{}", survivor.2);
    // The survivor names the lost rank in the bucket op it failed in.
    let error = survivor.2.lines().find(|l| l.contains("error: rank 0:")).unwrap_or_else(|| {
        panic!("rank 0 says why it failed:\n{}", survivor.2);
    });
    assert!(
        error.contains("\"gradients.bucket") && error.contains("lost rank(s) [1]"),
        "rank 0 names the op and the lost rank (rank 1 was lost at {op}): {error}"
    );
    // Step 1 was applied, none of step 2.
    let steps = steps_by_generation(dir.path());
    assert_eq!(steps.get(&0).map(Vec::as_slice), Some(&[1][..]), "{steps:?}");
}

#[test]
fn an_elastic_run_redoes_only_the_step_a_rank_was_killed_in_the_middle_of() {
    let dir = tempfile::tempdir().unwrap();
    let (_coordinator, addr) = serve(dir.path());
    // Rank 2 of the first world kills itself in the backward pass of step 5.
    let fail = ["--fail-in-backward", "5", "--rank-to-fail", "2"];
    let run = Small { addr: &addr, run_id: "backward", dir: dir.path(), world: "2:3", sentences: SENTENCES };
    let members: Vec<Proc> = (0..3).map(|id| small_member(&run, id, &[], &fail)).collect();
    let outcomes: Vec<_> = members.into_iter().map(|m| m.finish(DEADLINE)).collect();
    let all: String = outcomes.iter().map(|o| o.2.as_str()).collect::<Vec<_>>().join("\n");
    let killed: Vec<usize> = (0..3)
        .filter(|&i| std::os::unix::process::ExitStatusExt::signal(&outcomes[i].0) == Some(libc::SIGKILL))
        .collect();
    assert_eq!(killed.len(), 1, "one member killed itself:\n{all}");
    let op = killed_at(&outcomes[killed[0]].2);
    for (i, o) in outcomes.iter().enumerate().filter(|(i, _)| *i != killed[0]) {
        assert!(o.0.success(), "member {i} finishes at world 2:\n{}", o.2);
    }
    // The survivors' new world starts from step 4, its cause the bucket and the member lost.
    let note = all
        .lines()
        .find(|l| l.contains("generation 2: rank 0 of 2 from step 4"))
        .unwrap_or_else(|| panic!("the new world starts from the last applied step:\n{all}"));
    let lost = format!("members m{}", killed[0]);
    assert!(
        note.contains(&lost) && note.contains("\"gradients.bucket") && note.contains("lost rank(s) [2]"),
        "the re-form names the member, the op and the rank lost ({op} on the killed member): {note}"
    );
    let (worlds, applied) = traced(dir.path());
    assert_eq!(worlds, [(1, 3), (2, 2)], "{all}");
    assert_each_once(&applied, SENTENCES);
    // Only step 5 is redone: generation 1 applied 1 to 4, generation 2 goes on from 5.
    let steps = steps_by_generation(dir.path());
    assert_eq!(steps[&1], [1, 2, 3, 4], "{steps:?}");
    assert_eq!(steps[&2].first(), Some(&5), "{steps:?}");
}

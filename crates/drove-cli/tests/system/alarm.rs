//! The diversity alarm, end to end: `drove run --np 2` of `drove train ner`
//! with masking augmentation on MiniLM and a slice of CoNLL-2003.
//!
//! - Naive seeding (every rank and worker on one stream) sets it off at the
//!   first diagnosed step, which is step 50 by default: with `warn` the run
//!   finishes and the coordinator holds the event; with `fail` every rank stops
//!   at that step with the alarm's exit code (3).
//! - Derived seeding never does, diagnosed at every step of a whole short run.

use std::path::Path;
use std::process::Command;

use crate::common::{DROVE, assets, run, text};

fn train(out: &Path, store: &Path, run_id: &str, extra: &[&str]) -> Command {
    let a = assets();
    let mut cmd = Command::new(DROVE);
    cmd.args(["run", "--np", "2", "--run-id", run_id, "--store"])
        .arg(store)
        .args(["--", DROVE, "train", "ner", "--augment-mask", "0.15"])
        .args(["--epochs", "1", "--eval", "", "--workers", "1", "--data"])
        .arg(a.join("conll2003"))
        .arg("--model")
        .arg(a.join("minilm"))
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("RUST_LOG", "warn");
    cmd
}

fn summary(out: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(out.join("summary.json")).expect("summary.json")).unwrap()
}

fn runs(store: &Path) -> serde_json::Value {
    let out = run(Command::new(DROVE).args(["runs", "--json", "--store"]).arg(store));
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The run's diversity alarms (its other events are its options).
fn alarms(run: &serde_json::Value) -> Vec<serde_json::Value> {
    let events = run["events"].as_array().expect("events");
    events.iter().filter(|e| e["kind"] != "options").cloned().collect()
}

#[test]
fn naive_seeding_sets_the_alarm_off_at_the_first_diagnosed_step_and_warns() {
    let dir = tempfile::tempdir().unwrap();
    let (out, store) = (dir.path().join("out"), dir.path().join("store"));
    // 200 sentences over 2 ranks of 2: 50 steps, the first diagnosed by default.
    let o = run(&mut train(
        &out,
        &store,
        "naive",
        &["--seeding", "naive", "--max-train-sentences", "200", "--batch-size", "2"],
    ));
    let log = text(&o);
    assert!(o.status.success(), "warn lets the run finish: {log}");
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("warning: diversity alarm")).collect();
    assert_eq!(warnings.len(), 1, "one warning, on rank 0: {log}");
    assert!(warnings[0].starts_with("[0] warning: diversity alarm at step 50: Identical masks"), "{log}");
    assert!(warnings[0].contains("Every rank and worker drew the same random stream"), "{log}");
    let s = summary(&out);
    assert!(s["diversity_alarm"].as_str().is_some_and(|a| a.starts_with("step 50: Identical masks")), "{s}");
    let runs = runs(&store);
    let events = alarms(&runs["runs"][0]);
    assert_eq!(events.len(), 1, "{runs}");
    assert_eq!(
        (events[0]["kind"].as_str(), events[0]["step"].as_f64()),
        (Some("diversity_alarm"), Some(50.0))
    );
    assert!(events[0]["message"].as_str().unwrap().starts_with("Identical masks"), "{runs}");
}

#[test]
fn naive_seeding_with_fail_stops_every_rank_at_that_step_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let (out, store) = (dir.path().join("out"), dir.path().join("store"));
    // Batches of 8 rows: the first diagnosed step alone compares enough positions.
    let args = ["--seeding", "naive", "--max-train-sentences", "200", "--diagnose-every", "5"];
    let more = ["--on-identical-masks", "fail", "--batch-size", "8", "--log-every", "1"];
    let args: Vec<&str> = args.iter().chain(&more).copied().collect();
    let o = run(&mut train(&out, &store, "fail", &args));
    let log = text(&o);
    assert_eq!(o.status.code(), Some(3), "the alarm's exit code: {log}");
    // The ranks stop together; `drove run` may end one before it prints.
    let stopped = "the diversity alarm stopped the run at step 5: Identical masks";
    assert!(
        log.contains(&format!("error: rank 0: {stopped}"))
            || log.contains(&format!("error: rank 1: {stopped}")),
        "{log}"
    );
    assert!(!log.contains("step 5/"), "no step is taken after the alarm: {log}");
    assert!(!out.join("summary.json").exists(), "the run stopped before its end");
    let runs = runs(&store);
    let run = &runs["runs"][0];
    assert_eq!(run["state"], "failed", "{runs}");
    assert_eq!(
        alarms(run)[0]["step"].as_f64(),
        Some(5.0),
        "the event is stored before the ranks stop: {runs}"
    );
}

#[test]
fn derived_seeding_never_sets_it_off() {
    let dir = tempfile::tempdir().unwrap();
    let (out, store) = (dir.path().join("out"), dir.path().join("store"));
    let o = run(&mut train(
        &out,
        &store,
        "derived",
        &["--max-train-sentences", "80", "--diagnose-every", "1", "--batch-size", "2"],
    ));
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    assert!(!log.contains("diversity alarm"), "{log}");
    let s = summary(&out);
    assert!(s["diversity_alarm"].is_null(), "{s}");
    assert_eq!(s["mask_agreement"]["steps"], 20, "every step diagnosed: {s}");
    assert_eq!(s["mask_agreement"]["verdict"], "diverse", "{s}");
    let runs = runs(&store);
    assert!(alarms(&runs["runs"][0]).is_empty(), "{runs}");
    let options = &runs["runs"][0]["events"][0];
    assert_eq!(options["kind"], "options", "rank 0 records the run's options first: {runs}");
    let options: serde_json::Value = serde_json::from_str(options["message"].as_str().unwrap()).unwrap();
    assert_eq!((options["world_size"].as_u64(), options["diagnose_every"].as_u64()), (Some(2), Some(1)));
    assert_eq!(options["seeding"], "derived", "by the name --seeding takes");
}

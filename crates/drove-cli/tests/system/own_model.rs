//! The "train your own model" example (`examples/own_model.rs`, an MLP on a
//! synthetic regression set through `drove_train::Replica`) as the README runs
//! it, under `drove run --np 2`; and its distributed step checked against one
//! process: 2 processes x 8 rows = 1 x 16 = 2 backward passes x 8, in both
//! placements, and the placements agree; and, through `drove_launch`, under
//! `drove run --np 2 --max-restarts 1` with a rank killed once: the world
//! restarts, resumes from the latest checkpoint, and its metrics, report and
//! progress lines cover the whole run. Overlapping the all-reduce with
//! backward leaves every bit of the parameters as it was, at 2 and 3 processes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::{
    DROVE, assert_listed_run, read_latest, relative_difference, run, scale_difference, step_scales, text,
    under_run,
};
use drove_launch::Progress;
use drove_store::{Agg, Filter, Store};

/// The example's binary, built once per test process.
///
/// `cargo test` builds the examples (the test command's `cargo test
/// --workspace` leaves this nothing to do); `cargo test --all-targets` builds
/// them as test harnesses only, so the runnable example is built here, as the
/// tests were (the build lock is free while tests run).
fn example() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = crate::common::build_like_this_test(&["--example", "own_model"]);
            dir.join("examples").join(format!("own_model{}", std::env::consts::EXE_SUFFIX))
        })
        .clone()
}

fn own_model(args: &[&str]) -> Command {
    let mut cmd = Command::new(example());
    cmd.args(args);
    cmd
}

/// The losses the example prints at steps 0, 50, ... and at the end.
fn losses(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| l.split("loss ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Each applied step's (global loss, gradient norm before clipping) that the
/// example wrote with `--scales`, one JSON line a step.
fn scales(path: &str) -> Vec<(f64, f64)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    step_scales(&lines)
}

#[test]
fn the_example_trains_under_drove_run_as_the_readme_says() {
    let out = run(&mut under_run(2, own_model(&[])));
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("final loss") && stdout.contains("after 300 steps on 2 rank(s)"), "{log}");
    let l = losses(&stdout);
    let (first, last) = (l[0], *l.last().unwrap());
    assert!(last.is_finite() && last < first / 20.0, "the loss went from {first} to {last}: {log}");
}

#[test]
fn two_processes_of_8_equal_one_of_16_and_two_passes_of_8_in_both_placements() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let mut alone = Vec::new();
    for placement in ["host", "backend"] {
        let common = ["--steps", "5", "--placement", placement];
        // One rank of 16 at twice the rate of each of two ranks, which linear
        // scaling doubles: the same step.
        let one = path(&format!("one-{placement}"));
        let trail = |run: &str| format!("{run}.scales");
        let one_scales = trail(&one);
        let out = run(&mut own_model(
            &[&common[..], &["--rows", "16", "--lr", "0.02", "--save", &one, "--scales", &one_scales]]
                .concat(),
        ));
        assert!(out.status.success(), "{}", text(&out));
        let two = path(&format!("two-{placement}"));
        let two_scales = trail(&two);
        let args =
            [&common[..], &["--rows", "8", "--lr", "0.01", "--save", &two, "--scales", &two_scales]].concat();
        let out = run(&mut under_run(2, own_model(&args)));
        assert!(out.status.success(), "{}", text(&out));
        let passes = path(&format!("passes-{placement}"));
        let passes_scales = trail(&passes);
        let args = [
            &common[..],
            &["--rows", "8", "--passes", "2", "--lr", "0.02", "--save", &passes, "--scales", &passes_scales],
        ]
        .concat();
        let out = run(&mut own_model(&args));
        assert!(out.status.success(), "{}", text(&out));
        let (a, b, c) =
            (read_latest(Path::new(&one)), read_latest(Path::new(&two)), read_latest(Path::new(&passes)));
        let (d2, dp) = (relative_difference(&a, &b), relative_difference(&a, &c));
        eprintln!("{placement}: 2x8 vs 1x16 {d2:e}; 2 passes x 8 vs 1x16 {dp:e}");
        assert!(d2 < 1e-5, "{placement}: 2 processes x 8 differ from 1 x 16 by {d2}");
        assert!(dp < 1e-5, "{placement}: 2 passes x 8 differ from 1 pass x 16 by {dp}");
        // The parameters after AdamW cannot see a gradient's scale (a sum in
        // place of an average, a lost 1/passes); the loss and the norm can.
        let (s1, s2, sp) = (scales(&one_scales), scales(&two_scales), scales(&passes_scales));
        assert_eq!(s1.len(), 5);
        let (e2, ep) = (scale_difference(&s1, &s2), scale_difference(&s1, &sp));
        eprintln!("{placement}: loss and gradient norm: 2x8 vs 1x16 {e2:e}; 2 passes {ep:e}");
        assert!(
            e2 < 1e-5,
            "{placement}: 2 processes x 8: loss or gradient norm differ by {e2}: {s1:?} vs {s2:?}"
        );
        assert!(
            ep < 1e-5,
            "{placement}: 2 passes x 8: loss or gradient norm differ by {ep}: {s1:?} vs {sp:?}"
        );
        alone.push(a);
    }
    let d = relative_difference(&alone[0], &alone[1]);
    assert!(d < 1e-5, "host and backend placements differ by {d}");
    // The bound can fail: four steps are outside it.
    let short = path("short");
    let out = run(&mut own_model(&["--steps", "4", "--rows", "16", "--lr", "0.02", "--save", &short]));
    assert!(out.status.success(), "{}", text(&out));
    let moved = relative_difference(&alone[0], &read_latest(Path::new(&short)));
    eprintln!("host vs backend {d:e}; the fifth step moved the parameters by {moved:e}");
    assert!(moved > 1e-5, "the last step moved the parameters by only {moved}: the bound would not tell");
}

#[test]
fn overlapping_the_all_reduce_with_backward_changes_no_bit_at_2_and_3_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    for (np, passes) in [(2, "1"), (3, "2")] {
        for placement in ["host", "backend"] {
            // Three hidden layers: deep enough that the last two layers' parameters get hooks.
            let common = [
                "--steps",
                "20",
                "--rows",
                "5",
                "--passes",
                passes,
                "--placement",
                placement,
                "--depth",
                "3",
            ];
            let mut models = Vec::new();
            for (overlap, flag) in [(true, &[][..]), (false, &["--no-overlap"][..])] {
                let save = path(&format!("{np}-{placement}-{overlap}"));
                let args = [&common[..], flag, &["--save", &save]].concat();
                let out = run(&mut under_run(np, own_model(&args)));
                let log = text(&out);
                assert!(out.status.success(), "{log}");
                let hooked: usize = log
                    .split("all-reduce overlapped with backward: ")
                    .nth(1)
                    .and_then(|rest| rest.strip_prefix(if overlap { "true (" } else { "false (" }))
                    .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
                    .unwrap_or_else(|| panic!("no overlap line saying {overlap}: {log}"));
                assert_eq!(hooked >= 2, overlap, "{hooked} parameters hooked: {log}");
                models.push(read_latest(Path::new(&save)));
            }
            let (a, b) = (&models[0], &models[1]);
            assert_eq!(a.len(), b.len());
            for (name, values) in a {
                let differ = values.iter().zip(&b[name]).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert_eq!(
                    differ, 0,
                    "{np} ranks, {placement}, {passes} pass(es): {differ} values of {name} differ"
                );
            }
        }
    }
}

/// Rank 0's progress lines in `stderr` (relayed by `drove run` as `[0] drove-progress {...}`).
fn progress_of_rank_0(stderr: &str) -> Vec<Progress> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[0] "))
        .filter_map(|l| Progress::parse_line(l.as_bytes()))
        .collect()
}

#[test]
fn a_killed_rank_restarts_the_world_which_resumes_with_metrics_report_and_progress() {
    const STEPS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let (store, ckpt, report) =
        (dir.path().join("store"), dir.path().join("ckpt"), dir.path().join("report"));
    let ckpt_arg = ckpt.to_string_lossy().into_owned();
    let inner = own_model(&[
        "--steps",
        "40",
        "--checkpoint",
        &ckpt_arg,
        "--checkpoint-every",
        "10",
        "--fail-at-step",
        "25",
        "--rank-to-fail",
        "1",
    ]);
    let mut cmd = Command::new(DROVE);
    cmd.args(["run", "--np", "2", "--max-restarts", "1", "--run-id", "own", "--store"])
        .arg(&store)
        .arg("--")
        .arg(inner.get_program())
        .args(inner.get_args())
        // As `drove run` sets it on a terminal, where its bar draws these lines.
        .env("DROVE_PROGRESS", "launcher")
        .env("RUST_LOG", "warn");
    let out = run(&mut cmd);
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("rank 1: killing itself") && log.contains("restarting every rank (1 of 1)"),
        "{log}"
    );
    assert!(log.contains("resumed from") && log.contains("at step 20"), "{log}");

    // Progress: the first attempt up to the kill, the second from the
    // checkpoint at step 20 to the end; every line with the run's length and a loss.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let progress = progress_of_rank_0(&stderr);
    assert!(
        !stderr.lines().any(|l| l.starts_with("[1] drove-progress")),
        "only rank 0 sends progress: {log}"
    );
    let restart =
        progress.windows(2).position(|w| w[1].step <= w[0].step).expect("a restart in the progress") + 1;
    let steps = |ps: &[Progress]| ps.iter().map(|p| p.step).collect::<Vec<_>>();
    assert_eq!(steps(&progress[..restart])[0], 1, "{progress:?}");
    // Rank 1 died after step 25, so rank 0 took part in step 25's all-reduce:
    // it had applied at least step 24 when it was stopped.
    assert!(progress[restart - 1].step >= 24, "the first attempt reached the kill: {progress:?}");
    assert_eq!(steps(&progress[restart..]), (21..=STEPS).collect::<Vec<_>>(), "{progress:?}");
    assert!(progress.iter().all(|p| p.total == STEPS && p.loss.is_some_and(f64::is_finite)), "{progress:?}");

    // Metrics: both ranks recorded the loss at every step (a redone step's
    // point replaces the first attempt's).
    let stored = Store::open(&store).unwrap();
    let f = Filter { run_id: "own".into(), name: Some("loss".into()), ..Filter::default() };
    let counts = stored.aggregate(&f, Agg::Count).unwrap();
    assert_eq!(
        counts.iter().map(|r| r.step).collect::<Vec<_>>(),
        (1..=STEPS).map(|s| s as f64).collect::<Vec<_>>()
    );
    assert!(counts.iter().all(|r| r.value == 2.0), "both ranks at every step: {counts:?}");
    drop(stored);

    // `drove runs` lists it finished after one restart; `drove report` draws its loss.
    assert_listed_run(&store, "own", "finished", 1);
    let out = run(Command::new(DROVE)
        .arg("report")
        .arg("--store")
        .arg(&store)
        .args(["--run", "own", "--out"])
        .arg(&report));
    assert!(out.status.success(), "{}", text(&out));
    let page: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report.join("report.json")).unwrap()).unwrap();
    let loss = page["charts"].as_array().unwrap().iter().find(|c| c["id"] == "loss").expect("a loss chart");
    let x = loss["series"][0]["x"].as_array().expect("the loss chart's steps");
    assert_eq!(x.len() as u64, STEPS, "{loss}");
}

//! The "train your own model" example (`examples/own_model.rs`, an MLP on a
//! synthetic regression set through `drove_train::Replica`) as the README runs
//! it, under `drove run --np 2`; and its distributed step checked against one
//! process: 2 processes x 8 rows = 1 x 16 = 2 backward passes x 8, in both
//! placements, and the placements agree.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{read_latest, relative_difference, run, text, under_run};

/// The example's binary, built once per test process.
///
/// `cargo test --all-targets` compiles examples as test harnesses only, so
/// the runnable example is built here with the cargo that runs the tests, in
/// the same profile and target folder (the build lock is free while tests run;
/// the dependencies are the ones just built, so this compiles one file).
fn example() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(build_example).clone().unwrap_or_else(|e| panic!("{e}"))
}

fn build_example() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the test's own path: {e}"))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} is not under target/<profile>/deps", exe.display()))?;
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev",
        Some(other) => other,
        None => return Err(format!("no profile folder above {}", exe.display())),
    };
    let target_dir = profile_dir.parent().ok_or("no target folder above the profile")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(["build", "--quiet", "-p", "drove-cli", "--example", "own_model", "--profile", profile])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .map_err(|e| format!("running {}: {e}", Path::new(&cargo).display()))?;
    if !out.status.success() {
        return Err(format!(
            "building the own_model example failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let path = profile_dir.join("examples").join(format!("own_model{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        return Err(format!("cargo built the example but {} is missing", path.display()));
    }
    Ok(path)
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
        let out =
            run(&mut own_model(&[&common[..], &["--rows", "16", "--lr", "0.02", "--save", &one]].concat()));
        assert!(out.status.success(), "{}", text(&out));
        let two = path(&format!("two-{placement}"));
        let args = [&common[..], &["--rows", "8", "--lr", "0.01", "--save", &two]].concat();
        let out = run(&mut under_run(2, own_model(&args)));
        assert!(out.status.success(), "{}", text(&out));
        let passes = path(&format!("passes-{placement}"));
        let args =
            [&common[..], &["--rows", "8", "--passes", "2", "--lr", "0.02", "--save", &passes]].concat();
        let out = run(&mut own_model(&args));
        assert!(out.status.success(), "{}", text(&out));
        let (a, b, c) =
            (read_latest(Path::new(&one)), read_latest(Path::new(&two)), read_latest(Path::new(&passes)));
        let (d2, dp) = (relative_difference(&a, &b), relative_difference(&a, &c));
        eprintln!("{placement}: 2x8 vs 1x16 {d2:e}; 2 passes x 8 vs 1x16 {dp:e}");
        assert!(d2 < 1e-5, "{placement}: 2 processes x 8 differ from 1 x 16 by {d2}");
        assert!(dp < 1e-5, "{placement}: 2 passes x 8 differ from 1 pass x 16 by {dp}");
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

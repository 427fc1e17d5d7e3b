//! Runs the real `drove` binary and checks what it prints.

use std::process::{Command, Output};

use serde_json::Value;

fn drove(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_drove"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running the drove binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// Runs `drove args`, requires success, and parses stdout as one JSON object.
fn json(args: &[&str]) -> Value {
    let out = drove(args);
    assert!(out.status.success(), "drove {args:?} failed: {}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.trim_end().lines().count(), 1, "one JSON line expected, got:\n{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{text}"))
}

fn masks(seeding: &str) -> Vec<String> {
    [
        "diag",
        "masks",
        "--world-size",
        "4",
        "--workers",
        "4",
        "--seed",
        "42",
        "--seeding",
        seeding,
        "--probability",
        "0.15",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn masks_json(seeding: &str) -> Value {
    let mut args = masks(seeding);
    args.push("--json".into());
    json(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn f64_of(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

#[test]
fn naive_seeding_makes_every_rank_mask_alike() {
    let report = masks_json("naive");
    assert_eq!(f64_of(&report, "mean_agreement"), 1.0);
    assert_eq!(report["verdict"], "identical");
    assert_eq!(report["within_3_sigma"], false);
    assert_eq!(report["simulation"]["seeding"], "naive");
    assert_eq!(report["simulation"]["world_size"], 4);
    let matrix = report["matrix"].as_array().expect("matrix is an array");
    assert_eq!(matrix.len(), 4);
    for row in matrix {
        for x in row.as_array().expect("matrix rows are arrays") {
            assert_eq!(x.as_f64(), Some(1.0));
        }
    }
}

#[test]
fn derived_seeding_agrees_as_independent_masks_do() {
    let report = masks_json("derived");
    let (mean, expected, sigma) =
        (f64_of(&report, "mean_agreement"), f64_of(&report, "expected"), f64_of(&report, "sigma"));
    assert!((expected - 0.745).abs() <= 1e-12, "expected {expected}");
    assert!(sigma > 0.0 && sigma.is_finite(), "sigma {sigma}");
    assert!((mean - expected).abs() <= 3.0 * sigma, "mean {mean}, expected {expected}, sigma {sigma}");
    assert_eq!(report["verdict"], "diverse");
    assert_eq!(report["within_3_sigma"], true);
    assert_eq!(report["simulation"]["seeding"], "derived");
    assert_eq!(report["pairs"].as_array().map(Vec::len), Some(6));
}

#[test]
fn per_worker_seeding_is_diverse() {
    let report = masks_json("per-worker");
    assert_eq!(report["verdict"], "diverse");
    assert_eq!(report["simulation"]["seeding"], "per-worker");
}

#[test]
fn human_report_shows_the_agreement_and_the_verdict() {
    let args = masks("naive");
    let out = drove(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("mean agreement          1.000000"), "{text}");
    assert!(text.contains("expected p^2+(1-p)^2    0.745000"), "{text}");
    assert!(text.contains("verdict                 identical"), "{text}");
    assert!(text.contains("rank 3   1.000   1.000   1.000   1.000"), "{text}");
    // The training alarm's words (drove_collate's AgreementReport::explain).
    assert!(text.contains("Identical masks: agreement 1.0000"), "{text}");
    assert!(text.contains("Every rank and worker drew the same random stream"), "{text}");

    let args = masks("derived");
    let out = drove(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("verdict                 diverse"), "{text}");
    assert!(text.contains("Each rank masks independently"), "{text}");
}

#[test]
fn probability_outside_the_unit_interval_is_refused() {
    let mut args = masks("derived");
    let last = args.len() - 1;
    args[last] = "1.5".into();
    let out = drove(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("probability"), "{err}");
    assert!(err.contains("1.5"), "{err}");
}

#[test]
fn too_small_a_world_or_no_workers_is_refused() {
    let out = drove(&["diag", "masks", "--world-size", "1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("world size must be at least 2"), "{}", stderr(&out));
    let out = drove(&["diag", "masks", "--workers", "0"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("workers must be at least 1"), "{}", stderr(&out));
    let out = drove(&["diag", "masks", "--seeding", "random"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("unknown seeding"), "{}", stderr(&out));
}

const AUGMENT_KEY: [&str; 14] = [
    "seed",
    "--purpose",
    "augment",
    "--seed",
    "42",
    "--rank",
    "1",
    "--worker",
    "3",
    "--epoch",
    "5",
    "--count",
    "3",
    "--json",
];

/// NumPy's `PCG64(SeedSequence(<the key's words>))` gives the same numbers.
const AUGMENT_OUTPUTS: [&str; 3] = ["0x869f424a75b26bc1", "0xe6d533c5f9854199", "0x64faab2e29bd2d6a"];

#[test]
fn seed_prints_the_key_its_derived_seed_and_numpy_identical_outputs() {
    let first = drove(&AUGMENT_KEY);
    assert!(first.status.success(), "{}", stderr(&first));
    let second = drove(&AUGMENT_KEY);
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(first.stdout, second.stdout, "the same key must give the same stream in every process");

    let report: Value = serde_json::from_slice(&first.stdout).expect("seed --json prints JSON");
    assert_eq!(report["outputs"], serde_json::json!(AUGMENT_OUTPUTS));
    assert_eq!(report["key"], "augment seed=42 rank=1 worker=3 epoch=5 lane=0");
    let derived = report["derived_seed"].as_str().expect("derived_seed is a string");
    assert_eq!(derived.len(), 64);
    assert!(derived.bytes().all(|b| b.is_ascii_hexdigit()), "{derived}");

    let replay = drove(&["seed", "--replay", derived, "--count", "3"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    let text = stdout(&replay);
    let printed: Vec<&str> = text.lines().map(str::trim).filter(|l| l.starts_with("0x")).collect();
    assert_eq!(printed, AUGMENT_OUTPUTS, "{text}");
    assert!(text.contains(derived), "{text}");

    let replay = json(&["seed", "--replay", derived, "--count", "3", "--json"]);
    assert_eq!(replay["outputs"], serde_json::json!(AUGMENT_OUTPUTS));
    assert_eq!(replay["derived_seed"], derived);
}

#[test]
fn replaying_a_malformed_seed_says_what_a_seed_looks_like() {
    let out = drove(&["seed", "--replay", "abc"]);
    assert!(!out.status.success());
    assert!(stdout(&out).is_empty());
    let err = stderr(&out);
    assert!(err.contains("64 hex digits"), "{err}");
}

#[test]
fn per_sample_streams_ignore_rank_and_worker() {
    let a =
        json(&["seed", "--purpose", "augment", "--seed", "42", "--epoch", "1", "--sample", "9", "--json"]);
    assert_eq!(a["sample"], 9);
    assert_eq!(a["outputs"].as_array().map(Vec::len), Some(4));
    assert!(a["key"].as_str().is_some_and(|k| k.contains("per-sample")), "{a}");
    let b =
        json(&["seed", "--purpose", "augment", "--seed", "42", "--epoch", "1", "--sample", "10", "--json"]);
    assert_eq!(a["derived_seed"], b["derived_seed"], "one family per (seed, purpose, epoch)");
    assert_ne!(a["outputs"], b["outputs"], "each sample has its own stream");

    let out = drove(&["seed", "--purpose", "augment", "--seed", "42", "--sample", "9", "--rank", "1"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--rank is not part of a per-sample stream"), "{}", stderr(&out));
}

#[test]
fn bench_reports_positive_finite_rates() {
    let report = json(&[
        "bench",
        "mask",
        "--batch",
        "4",
        "--seq",
        "32",
        "--seconds",
        "0.05",
        "--workers",
        "2",
        "--json",
    ]);
    for key in [
        "masker_tokens_per_s",
        "collate_tokens_per_s",
        "loader_tokens_per_s",
        "baseline_copy_tokens_per_s",
        "baseline_rng_u64_per_s",
        "masker_vs_copy",
        "collate_vs_copy",
    ] {
        let x = f64_of(&report, key);
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    assert_eq!(report["batch"], 4);
    assert_eq!(report["seq"], 32);
    assert_eq!(report["workers"], 2);
    assert_eq!(report["seeding"], "derived");
    assert!(report["machine"]["nproc"].as_u64().is_some_and(|n| n >= 1), "{report}");
    for key in ["masker", "collate", "loader", "baseline_copy", "baseline_rng"] {
        assert!(report["iterations"][key].as_u64().is_some_and(|n| n >= 3), "{key}: {report}");
    }
}

#[test]
fn bench_without_workers_skips_the_loader_and_prints_a_table() {
    let out =
        drove(&["bench", "mask", "--batch", "2", "--seq", "16", "--seconds", "0", "--seeding", "naive"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("masker (1 thread)"), "{text}");
    assert!(text.contains("baseline: copy u32"), "{text}");
    assert!(!text.contains("loader"), "{text}");
    // The spinner draws only on a terminal: nothing reaches a piped stderr.
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn an_id_outside_the_key_is_a_one_line_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_drove"))
        .args(["seed", "--purpose", "init", "--seed", "1", "--epoch", "2"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running the drove binary");
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).is_empty());
    assert_eq!(
        stderr(&out),
        "error: --epoch is not part of an init key (initial weights must be the same on every rank)\n"
    );
}

#[test]
fn bench_allreduce_spawns_ranks_and_reports_bandwidth() {
    for transport in ["auto", "tcp"] {
        let report = json(&[
            "bench",
            "allreduce",
            "--np",
            "2",
            "--sizes",
            "1KiB,64KiB",
            "--iters",
            "10",
            "--transport",
            transport,
            "--json",
        ]);
        assert_eq!(report["np"], 2);
        let rows = report["results"].as_array().expect("results");
        assert_eq!(rows.len(), 4, "two sizes x (allreduce, broadcast): {report}");
        for row in rows {
            assert!(row["iterations"].as_u64().unwrap() >= 10, "{row}");
            for key in ["median_us", "algbw_gbps", "busbw_gbps", "memcpy_gbps"] {
                let v = f64_of(row, key);
                assert!(v.is_finite() && v > 0.0, "{key} = {v} in {row}");
            }
        }
        // For 2 ranks the all-reduce's busbw equals its algbw.
        assert_eq!(f64_of(&rows[0], "busbw_gbps"), f64_of(&rows[0], "algbw_gbps"));
    }
    let out = drove(&["bench", "allreduce", "--sizes", "12XB"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("unknown unit"), "{}", stderr(&out));
}

#[test]
fn non_finite_or_out_of_range_training_settings_are_refused_by_name() {
    for (flag, value, says) in [
        ("--lr", "nan", "--lr must be a finite number of at least 0, found NaN"),
        ("--lr", "-1", "--lr must be a finite number of at least 0, found -1"),
        ("--lr", "inf", "--lr must be a finite number of at least 0, found inf"),
        ("--warmup", "1.5", "--warmup must be in [0, 1], found 1.5"),
        ("--weight-decay", "-0.01", "--weight-decay must be a finite number of at least 0, found -0.01"),
        ("--clip-norm", "NaN", "--clip-norm must be a finite number of at least 0, found NaN"),
        ("--augment-mask", "-0.2", "--augment-mask must be in [0, 1], found -0.2"),
        ("--dropout", "2", "--dropout must be in [0, 1], found 2"),
    ] {
        let out = drove(&["train", "ner", flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = stderr(&out);
        assert!(err.contains(says), "{flag} {value}: {err}");
    }
}

//! `drove train ner` as real processes on the real CoNLL-2003 files and MiniLM
//! weights (fetched by `scripts/fetch-assets.sh`): gradient averaging across
//! processes is exact, a rank killed mid-epoch stops the run and `--resume`
//! finishes it as if nothing happened, and bad input gets errors naming the
//! file and the problem. Every wait has a deadline.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use crate::common::{
    DROVE, assets, read_latest, relative_difference, run, scale_difference, summary_scales, text, under_run,
};

/// `drove train ner` on the real assets with the given extra arguments.
fn train(out: &Path, extra: &[&str]) -> Command {
    let a = assets();
    train_on(&a.join("conll2003"), &a.join("minilm"), out, extra)
}

fn train_on(data: &Path, model: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(DROVE);
    cmd.args(["train", "ner", "--data"])
        .arg(data)
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("RUST_LOG", "warn");
    cmd
}

fn read_model(dir: &Path) -> HashMap<String, Vec<f32>> {
    read_latest(&dir.join("checkpoints"))
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("summary.json")).expect("summary.json")).unwrap()
}

/// Asserts two runs took steps of one scale: at every step the same global
/// loss and gradient norm before clipping (`summary.json`'s `step_scales`),
/// within the order of the sums.
fn assert_same_scale(what: &str, a: &Path, b: &Path) {
    let (a, b) = (summary_scales(a), summary_scales(b));
    let d = scale_difference(&a, &b);
    eprintln!("{what}: loss and gradient norm differ by {d:e}");
    // The order of the f32 sums moves them by about 6e-6 here; a gradient of
    // the wrong scale by 0.5 or more.
    assert!(d < 1e-4, "{what}: loss or gradient norm differ by {d} (relative): {a:?} vs {b:?}");
}

const SMALL: &[&str] = &["--max-train-sentences", "16", "--epochs", "5", "--dropout", "0", "--eval", ""];

#[test]
fn two_processes_of_8_equal_one_of_16_in_both_placements() {
    let dir = tempfile::tempdir().unwrap();
    let common = [SMALL, &["--lr-scaling", "none", "--lr", "1e-3", "--warmup", "0"]].concat();
    let mut alone = Vec::new();
    for placement in ["host", "backend"] {
        let (one, two) =
            (dir.path().join(format!("one-{placement}")), dir.path().join(format!("two-{placement}")));
        let args = [&common[..], &["--placement", placement]].concat();
        let out =
            run(train(&one, &[&args[..], &["--batch-size", "16"]].concat()).env("RAYON_NUM_THREADS", "2"));
        assert!(out.status.success(), "{}", text(&out));
        let out = run(&mut under_run(2, train(&two, &[&args[..], &["--batch-size", "8"]].concat())));
        assert!(out.status.success(), "{}", text(&out));
        let (a, b) = (read_model(&one), read_model(&two));
        assert_eq!(summary(&one)["steps"], 5);
        assert_eq!(summary(&two)["steps"], 5);
        assert_same_scale(&format!("{placement}: 2x8 vs 1x16"), &one, &two);
        // And a scale every world size would share (the loss's normalisation
        // doubled everywhere): MiniLM's fresh classifier head (std 0.02)
        // gives nearly equal logits, so the first step's mean token loss is
        // close to ln(9), for CoNLL-2003's 9 labels.
        let first = summary_scales(&one)[0].0;
        let uniform = 9f64.ln();
        eprintln!("{placement}: the first step's loss {first} against ln(9) = {uniform}");
        assert!(
            (first / uniform - 1.0).abs() < 0.1,
            "{placement}: the first step's mean token loss {first} is not near ln(9) = {uniform}"
        );
        let d = relative_difference(&a, &b);
        eprintln!("{placement}: 2x8 vs 1x16: {d:e}");
        assert!(d < 1e-5, "{placement}: parameters differ by {d} (relative) after 5 steps");
        alone.push(a);
    }
    assert_same_scale(
        "host vs backend placement",
        &dir.path().join("one-host"),
        &dir.path().join("one-backend"),
    );
    let d = relative_difference(&alone[0], &alone[1]);
    eprintln!("host vs backend placement: {d:e}");
    assert!(d < 1e-5, "the host and backend placements differ by {d} (relative) after 5 steps");
    // The bound can fail: one step fewer is outside it.
    let short = dir.path().join("short");
    let out = run(&mut train(&short, &[&common[..], &["--batch-size", "16", "--max-steps", "4"]].concat()));
    assert!(out.status.success(), "{}", text(&out));
    let moved = relative_difference(&alone[0], &read_model(&short));
    eprintln!("the last step moved the parameters by {moved:e}");
    assert!(moved > 1e-5, "the last step moved the parameters by only {moved}: the bound would not tell");
}

#[test]
fn micro_batches_take_the_step_of_the_whole_batch_dropout_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));
    // Dropout (config.json's 0.1) and masking on: a row's masks do not depend on
    // which micro-batch it lands in, so only the order of the sums differs.
    let common = [
        "--max-train-sentences",
        "16",
        "--epochs",
        "5",
        "--eval",
        "",
        "--batch-size",
        "16",
        "--augment-mask",
        "0.15",
        "--lr-scaling",
        "none",
        "--lr",
        "1e-3",
        "--warmup",
        "0",
    ];
    let out =
        run(train(&whole, &[&common[..], &["--micro-batches", "1"]].concat()).env("RAYON_NUM_THREADS", "2"));
    assert!(out.status.success(), "{}", text(&out));
    // Three micro-batches of 6, 5 and 5 rows on two threads.
    let out =
        run(train(&split, &[&common[..], &["--micro-batches", "3"]].concat()).env("RAYON_NUM_THREADS", "2"));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(summary(&split)["steps"], 5);
    assert_same_scale("1 vs 3 micro-batches", &whole, &split);
    let (a, b) = (read_model(&whole), read_model(&split));
    let d = relative_difference(&a, &b);
    assert!(d < 1e-5, "parameters differ by {d} (relative) after 5 steps");
    let short = dir.path().join("short");
    let out = run(&mut train(&short, &[&common[..], &["--micro-batches", "1", "--max-steps", "4"]].concat()));
    assert!(out.status.success(), "{}", text(&out));
    let moved = relative_difference(&a, &read_model(&short));
    eprintln!("1 vs 3 micro-batches: {d:e}; the last step moved the parameters by {moved:e}");
    assert!(moved > 1e-5, "the last step moved the parameters by only {moved}: the bound would not tell");
}

#[test]
fn a_rank_killed_mid_epoch_stops_the_run_and_resume_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (whole, broken) = (dir.path().join("whole"), dir.path().join("broken"));
    // 64 sentences over 2 ranks of 8: 4 steps an epoch, 2 epochs, dropout on.
    let args = [
        "--max-train-sentences",
        "64",
        "--max-eval-sentences",
        "48",
        "--eval",
        "test",
        "--epochs",
        "2",
        "--batch-size",
        "8",
        "--checkpoint-every",
        "3",
        "--augment-mask",
        "0.15",
    ];
    let out = run(&mut under_run(2, train(&whole, &args)));
    assert!(out.status.success(), "{}", text(&out));

    let kill = [&args[..], &["--fail-at-step", "7", "--rank-to-fail", "1"]].concat();
    let out = run(&mut under_run(2, train(&broken, &kill)));
    let log = text(&out);
    assert_eq!(out.status.code(), Some(137), "the run exits as its killed rank did: {log}");
    assert!(log.contains("rank 1") && log.contains("SIGKILL"), "{log}");
    // The last checkpoint is the mid-epoch one of step 6, complete and loadable.
    let latest = std::fs::read_to_string(broken.join("checkpoints/latest")).unwrap();
    assert_eq!(latest.trim(), "step-00000006");
    assert_eq!(read_model(&broken).len(), read_model(&whole).len());

    let resume = [&args[..], &["--resume"]].concat();
    let out = run(&mut under_run(2, train(&broken, &resume)));
    let log = text(&out);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("resumed from") && log.contains("step 6"), "{log}");
    let (a, b) = (summary(&whole), summary(&broken));
    assert_eq!(b["steps"], 8);
    let (fa, fb) = (a["test_f1"].as_f64().unwrap(), b["test_f1"].as_f64().unwrap());
    assert!((fa - fb).abs() <= 0.005, "test F1 {fb} after resuming vs {fa} uninterrupted");
    let d = relative_difference(&read_model(&whole), &read_model(&broken));
    assert!(d < 1e-5, "resumed parameters differ by {d} (relative)");
    // A restart by `drove run --max-restarts` itself (DROVE_RESTART_COUNT,
    // resuming from the latest checkpoint) is own_model.rs's test, on a model
    // that trains in a fraction of the time.
}

#[test]
fn a_missing_asset_folder_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&mut train_on(Path::new("/nonexistent/conll"), &assets().join("minilm"), dir.path(), &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("data folder /nonexistent/conll does not exist") && err.contains("fetch-assets"),
        "{err}"
    );
}

#[test]
fn a_config_that_disagrees_with_the_weights_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    let real = assets().join("minilm");
    for f in ["model.safetensors", "vocab.txt"] {
        std::os::unix::fs::symlink(real.join(f), model.join(f)).unwrap();
    }
    let config = std::fs::read_to_string(real.join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["intermediate_size"] = 1024.into();
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let out = run(&mut train_on(&assets().join("conll2003"), &model, &dir.path().join("out"), SMALL));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("config.json")
            && err.contains("model.safetensors")
            && err.contains("[1536")
            && err.contains("1024"),
        "{err}"
    );
}

#[test]
fn a_test_label_never_seen_in_training_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("train.txt"),
        "Alice NNP B-NP B-PER\nsmiled VBD B-VP O\n\nBob NNP B-NP B-PER\nran VBD B-VP O\n",
    )
    .unwrap();
    std::fs::write(data.join("valid.txt"), "Alice NNP B-NP B-PER\n").unwrap();
    std::fs::write(data.join("test.txt"), "Bob NNP B-NP B-PER\nin IN B-PP O\nParis NNP B-NP B-LOC\n")
        .unwrap();
    let out = run(&mut train_on(&data, &assets().join("minilm"), &dir.path().join("out"), &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("test.txt:3") && err.contains("B-LOC") && err.contains("never seen"), "{err}");
}

/// A training set of one sentence of 600 single-token words, 602 tokens with
/// [CLS] and [SEP]: longer than MiniLM's 512 positions.
fn long_sentence_data(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("data");
    std::fs::create_dir(&data).unwrap();
    let words: String =
        (0..600).map(|i| if i % 7 == 0 { "Paris NNP B-NP B-LOC\n" } else { "the DT B-NP O\n" }).collect();
    std::fs::write(data.join("train.txt"), words).unwrap();
    data
}

#[test]
fn a_max_len_past_the_position_table_is_refused_and_the_table_s_length_trains() {
    let dir = tempfile::tempdir().unwrap();
    let data = long_sentence_data(dir.path());
    let model = assets().join("minilm");
    let small = ["--epochs", "1", "--eval", "", "--batch-size", "1", "--workers", "1"];
    let out = run(&mut train_on(
        &data,
        &model,
        &dir.path().join("long"),
        &[&small[..], &["--max-len", "600"]].concat(),
    ));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused with an error, not a panic (101): {err}");
    assert!(
        err.contains("--max-len 600")
            && err.contains("max_position_embeddings 512")
            && err.contains("minilm/config.json")
            && !err.contains("panicked"),
        "{err}"
    );
    // At the table's length the same sentence is truncated to it and trains.
    let out = run(&mut train_on(
        &data,
        &model,
        &dir.path().join("fits"),
        &[&small[..], &["--max-len", "512"]].concat(),
    ));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(summary(&dir.path().join("fits"))["steps"], 1);
}

#[test]
fn an_unreadable_checkpoint_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let step = out_dir.join("checkpoints/step-00000003");
    std::fs::create_dir_all(&step).unwrap();
    std::fs::write(out_dir.join("checkpoints/latest"), "step-00000003").unwrap();
    std::fs::write(
        step.join("state.json"),
        r#"{"epoch":0,"batch":3,"global_step":3,"world_size":1,"batch_size":32,"seed":42,"train_sentences":16,"history":[],"optimizer_step":3}"#,
    )
    .unwrap();
    std::fs::write(step.join("model.safetensors"), b"not really").unwrap();
    let out = run(&mut train(&out_dir, &[SMALL, &["--resume"]].concat()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("step-00000003/model.safetensors") && err.contains("unreadable"), "{err}");
}

#[test]
fn a_step_made_non_finite_stops_every_rank_and_keeps_the_last_finite_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--lr", "1e30", "--lr-scaling", "none", "--warmup", "0", "--checkpoint-every", "1"];
    let args: Vec<&str> =
        SMALL.iter().chain(&["--batch-size", "4", "--workers", "1"]).chain(&args).copied().collect();
    let out = run(&mut under_run(2, train(dir.path(), &args)));
    assert!(!out.status.success(), "a step of lr 1e30 went through: {}", text(&out));
    let log = text(&out);
    for rank in 0..2 {
        // One error, the same on every rank: the step and the ranks at fault.
        let line = format!(
            "[{rank}] error: rank {rank}: step 2: the loss is NaN, not finite (local loss not finite on rank(s) [0, 1]); no update was applied"
        );
        assert!(log.contains(&line), "rank {rank}: {log}");
    }
    let checkpoints = dir.path().join("checkpoints");
    let latest = std::fs::read_to_string(checkpoints.join("latest")).expect("the checkpoint of step 1");
    assert_eq!(latest.trim(), "step-00000001", "{log}");
    for (name, values) in read_latest(&checkpoints) {
        assert!(values.iter().all(|v| v.is_finite()), "{name} holds non-finite values");
    }
}

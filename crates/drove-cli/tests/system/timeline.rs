//! The timeline (`drove train ner --timeline FILE`): two ranks with two
//! micro-batches, the diagnostic and a mid-epoch checkpoint; rank 0 writes one
//! Chrome trace-event file, which must parse, name a process per rank and a
//! track per thread of work, and within each step keep the main track's phases
//! apart, in order, adding up to the step's wall time within 10%, with the
//! gradient buckets' all-reduces on the engine's track starting during backward
//! and backward's levels marked on the micro-batches' tracks.

use std::process::Command;

use crate::common::{DROVE, assets, run, text, under_run};
use serde_json::Value;

fn num(e: &Value, key: &str) -> i64 {
    e[key].as_i64().unwrap_or_else(|| panic!("{key} of {e}"))
}

#[allow(clippy::too_many_lines)] // tests are exempt: one scenario, read top to bottom
#[test]
fn the_timeline_holds_every_rank_and_its_steps_phases_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (out, file) = (dir.path().join("out"), dir.path().join("trace.json"));
    let a = assets();
    let mut inner = Command::new(DROVE);
    inner
        .args(["train", "ner", "--max-train-sentences", "48", "--batch-size", "4", "--epochs", "1"])
        .args(["--eval", "", "--workers", "1", "--micro-batches", "2", "--augment-mask", "0.15"])
        .args(["--diagnose-every", "2", "--checkpoint-every", "3", "--data"])
        .arg(a.join("conll2003"))
        .arg("--model")
        .arg(a.join("minilm"))
        .arg("--out")
        .arg(&out)
        .env("DROVE_TIMELINE", &file)
        .env("RUST_LOG", "warn");
    let o = run(&mut under_run(2, inner));
    assert!(o.status.success(), "{}", text(&o));
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(
        files.iter().filter(|n| n.to_string_lossy().contains("trace")).count(),
        1,
        "one file: {files:?}"
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).expect("the timeline")).expect("JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents");

    for rank in 0..2i64 {
        let meta = |name: &str| -> Vec<String> {
            events
                .iter()
                .filter(|e| e["ph"] == "M" && e["name"] == name && e["pid"] == rank)
                .map(|e| e["args"]["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(meta("process_name"), [format!("rank {rank}")]);
        let mut tracks = meta("thread_name");
        tracks.sort();
        assert_eq!(tracks, ["all-reduce engine", "main", "micro-batch 0", "micro-batch 1"], "rank {rank}");

        let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X" && e["pid"] == rank).collect();
        for e in &complete {
            assert!(num(e, "dur") >= 0 && num(e, "ts") > 0, "{e}");
        }
        assert!(
            complete.iter().any(|e| e["cat"] == "op" && e["name"] == "all_reduce gradients.bucket1"),
            "each gradient bucket's all-reduce is drawn"
        );
        // The word embedding, the first parameter, goes as its touched rows.
        assert!(
            complete.iter().any(|e| e["cat"] == "op" && e["name"] == "all_gather gradients.bucket0.values"),
            "the embedding's rows are drawn"
        );
        let steps: Vec<&&Value> = complete.iter().filter(|e| e["cat"] == "step").collect();
        assert_eq!(steps.len(), 6, "rank {rank}: 48 sentences over 2 ranks of 4");
        for (k, step) in steps.iter().enumerate() {
            let n = k as i64 + 1;
            assert_eq!(step["name"], format!("step {n}"));
            let (start, end) = (num(step, "ts"), num(step, "ts") + num(step, "dur"));
            let mut phases: Vec<&&Value> = complete
                .iter()
                .filter(|e| e["tid"] == 0 && e["cat"] == "phase" && (start..end).contains(&num(e, "ts")))
                .collect();
            phases.sort_by_key(|e| num(e, "ts"));
            let names: Vec<&str> = phases.iter().map(|e| e["name"].as_str().unwrap()).collect();
            let mut want = vec!["data wait", "counts all-reduce", "forward+backward"];
            if n % 2 == 0 {
                want.push("diagnostic");
            }
            want.extend(["loss all-reduce", "gradient all-reduce", "clip", "optimizer"]);
            if n == 3 {
                want.push("checkpoint");
            }
            assert_eq!(names, want, "rank {rank} step {n}");
            for pair in phases.windows(2) {
                assert!(
                    num(pair[0], "ts") + num(pair[0], "dur") <= num(pair[1], "ts"),
                    "overlap: {} {}",
                    pair[0],
                    pair[1]
                );
            }
            let last = phases.last().unwrap();
            assert!(num(last, "ts") + num(last, "dur") <= end + 1, "a phase past its step: {last}");
            // The all-reduce overlaps backward: from the second step (the
            // first measures where the gradients are finished), a bucket is
            // whole and handed to the engine before backward has ended.
            let within = |e: &&&Value| (start..end).contains(&num(e, "ts"));
            let buckets: Vec<i64> =
                complete.iter().filter(|e| e["tid"] == 1000 && within(e)).map(|e| num(e, "ts")).collect();
            assert!(!buckets.is_empty(), "rank {rank} step {n}: no bucket on the engine's track");
            let backward_end = complete
                .iter()
                .filter(|e| e["name"] == "backward" && within(e))
                .map(|e| num(e, "ts") + num(e, "dur"))
                .max()
                .expect("backward spans");
            if n > 1 {
                let first = buckets.iter().min().unwrap();
                assert!(
                    *first < backward_end,
                    "rank {rank} step {n}: the first bucket at {first} us, backward ended at {backward_end}"
                );
            }
            let sum: i64 = phases.iter().map(|e| num(e, "dur")).sum();
            let wall = num(step, "dur");
            assert!(sum as f64 >= 0.9 * wall as f64, "rank {rank} step {n}: phases {sum} us of {wall} us");
        }
        for tid in [1i64, 2] {
            let mut micro: Vec<&&Value> =
                complete.iter().filter(|e| e["tid"] == tid && e["cat"] == "micro").collect();
            micro.sort_by_key(|e| num(e, "ts"));
            assert_eq!(micro.len(), 12, "a forward and a backward per step on track {tid}");
            // Backward's levels in the five overlapped steps: each inside a
            // backward span, at least one per encoder layer and the classifier.
            let levels: Vec<&&Value> =
                complete.iter().filter(|e| e["tid"] == tid && e["cat"] == "level").collect();
            assert!(levels.len() >= 5 * 7, "rank {rank} track {tid}: {} levels", levels.len());
            for level in &levels {
                let (ts, te) = (num(level, "ts"), num(level, "ts") + num(level, "dur"));
                let inside = micro.iter().any(|b| {
                    b["name"] == "backward" && num(b, "ts") <= ts && te <= num(b, "ts") + num(b, "dur")
                });
                assert!(inside, "rank {rank}: a level outside backward: {level}");
                let name = level["name"].as_str().unwrap();
                assert!(name.starts_with("backward bert.") || name == "backward classifier", "{level}");
            }
            for (i, pair) in micro.windows(2).enumerate() {
                assert!(
                    num(pair[0], "ts") + num(pair[0], "dur") <= num(pair[1], "ts"),
                    "overlap on track {tid}"
                );
                let want = if i % 2 == 0 { ("forward", "backward") } else { ("backward", "forward") };
                assert_eq!((pair[0]["name"].as_str().unwrap(), pair[1]["name"].as_str().unwrap()), want);
            }
        }
    }
}

//! One progress bar: `drove run` on a terminal (a pseudo-terminal from
//! util-linux's `script`) draws one bar for the run, fed by rank 0, with the
//! ranks' other lines above it; off a terminal, per-step lines as before.

use std::process::Command;

use crate::common::{DROVE, assets, run, text};

fn train_args(out: &std::path::Path) -> Vec<String> {
    let a = assets();
    let mut args: Vec<String> =
        ["run", "--np", "2", "--", DROVE, "train", "ner", "--max-train-sentences", "48"]
            .map(String::from)
            .to_vec();
    args.extend(
        ["--batch-size", "4", "--epochs", "1", "--eval", "", "--workers", "1", "--log-every", "1"]
            .map(String::from),
    );
    args.push(format!("--data={}", a.join("conll2003").display()));
    args.push(format!("--model={}", a.join("minilm").display()));
    args.push(format!("--out={}", out.display()));
    args
}

/// A shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[test]
fn drove_run_on_a_terminal_draws_one_bar_fed_by_rank_0() {
    if Command::new("script").arg("--version").output().is_err() {
        crate::common::skip("no `script` (util-linux) to make a pseudo-terminal");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = train_args(&dir.path().join("tty"));
    let line =
        std::iter::once(quote(DROVE)).chain(args.iter().map(|a| quote(a))).collect::<Vec<_>>().join(" ");
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-f", "-c", &format!("stty cols 160 rows 40; exec {line}"), "/dev/null"])
        .env("RUST_LOG", "warn");
    let out = run(&mut cmd);
    let tty = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{tty}");
    // The bar, redrawn in place as steps go by (one line, cleared and rewritten).
    let states: std::collections::BTreeSet<u32> =
        (1..=6).filter(|k| tty.contains(&format!("] {k}/6 steps epoch 1 loss"))).collect();
    assert!(states.len() >= 4, "the bar moved through the steps: {states:?}\n{tty}");
    assert!(tty.contains("\x1b[2K"), "the bar is redrawn in place");
    assert!(!tty.contains("[0] step 1/6"), "no per-step lines on a terminal:\n{tty}");
    assert!(!tty.contains("drove-progress"), "progress lines are drawn, not shown:\n{tty}");
    assert!(tty.contains("[0] trained 6 steps on 2 rank(s)"), "other lines above the bar:\n{tty}");

    // Off a terminal: lines as they come, no bar.
    let plain = run(Command::new(DROVE).args(train_args(&dir.path().join("plain"))).env("RUST_LOG", "warn"));
    let log = text(&plain);
    assert!(plain.status.success(), "{log}");
    assert!(log.contains("[0] step 1/6 epoch 1 loss"), "{log}");
    assert!(!log.contains("steps epoch 1 loss") && !log.contains("drove-progress"), "{log}");
}

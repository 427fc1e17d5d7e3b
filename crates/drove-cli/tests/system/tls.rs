//! TLS end to end: a `drove coordinator` serving `https://` with a
//! self-signed certificate (made as the coordinator's own TLS test makes it),
//! `drove train ner` ranks under `drove run` meeting and recording their
//! metrics through it, then `drove metrics` and `drove report` reading them
//! back, every client trusting the certificate through `DROVE_TLS_CA` and
//! nothing else. Without that variable a client refuses, saying to set it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::{DROVE, Proc, launch_env_removed, tiny_training};

/// Long enough for a loaded machine; a hang still ends the test.
const DEADLINE: Duration = Duration::from_secs(600);
/// The run's sentences: 2 ranks in batches of 2, 3 steps each.
const SENTENCES: usize = 12;

/// A certificate for `localhost`, its key and the CA file that trusts it
/// (the certificate itself), written in `dir`.
fn certificate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key, ca) = (dir.join("cert.pem"), dir.join("key.pem"), dir.join("ca.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    std::fs::write(&ca, made.cert.pem()).unwrap();
    (cert, key, ca)
}

/// `drove ARGS` as a client of the coordinator, trusting `ca` if given;
/// its exit code, stdout lines and stderr.
fn client(args: &[&str], ca: Option<&Path>) -> (Option<i32>, Vec<String>, String) {
    let mut cmd = launch_env_removed(Command::new(DROVE));
    cmd.args(args).env_remove("DROVE_TLS_CA");
    if let Some(ca) = ca {
        cmd.env("DROVE_TLS_CA", ca);
    }
    let (status, out, err) = Proc::spawn(&mut cmd).finish(DEADLINE);
    (status.code(), out, err)
}

#[test]
fn ranks_metrics_and_report_reach_an_https_coordinator_trusting_drove_tls_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca) = certificate(dir.path());
    let store = dir.path().join("store");
    let mut coordinator = Proc::spawn(
        launch_env_removed(Command::new(DROVE))
            .args(["coordinator", "--listen", "127.0.0.1:0", "--store"])
            .arg(&store)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key),
    );
    let line = coordinator.line(DEADLINE, |l| l.contains("listening on "));
    let port = line.rsplit(':').next().unwrap().trim().to_string();
    // The certificate names localhost: the clients must check it against that name.
    let url = format!("https://localhost:{port}");

    // No CA given: refused before any call, saying what to set.
    let (code, out, err) = client(&["runs", "--coordinator", &url], None);
    assert_eq!(code, Some(1), "{err}");
    assert!(out.is_empty(), "{out:?}");
    assert!(err.contains("uses TLS: set DROVE_TLS_CA"), "{err}");

    // Two ranks meet, train and record their metrics over TLS.
    let mut run = launch_env_removed(Command::new(DROVE));
    run.args(["run", "--np", "2", "--coordinator", &url, "--run-id", "over-tls", "--"])
        .arg(DROVE)
        .args(tiny_training(dir.path(), SENTENCES, &dir.path().join("out")))
        .env("DROVE_TLS_CA", &ca);
    let (status, _, err) = Proc::spawn(&mut run).finish(DEADLINE);
    assert!(status.success(), "{status}\n{err}");

    let (code, out, err) = client(
        &["metrics", "--coordinator", &url, "--run", "over-tls", "--name", "loss", "--agg", "raw", "--json"],
        Some(&ca),
    );
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out[0]).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    let mut seen: Vec<(i64, f64)> = report["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| (p["rank"].as_i64().expect("a rank"), p["step"].as_f64().expect("a step")))
        .collect();
    seen.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let steps = SENTENCES / 4;
    let every: Vec<(i64, f64)> = (0..2).flat_map(|r| (1..=steps).map(move |s| (r, s as f64))).collect();
    assert_eq!(seen, every, "each rank's loss at each step arrived over TLS: {report}");

    let written = dir.path().join("report");
    let (code, out, err) = client(
        &["report", "--coordinator", &url, "--run", "over-tls", "--out", written.to_str().unwrap()],
        Some(&ca),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.join("\n").contains("of run \"over-tls\""), "{out:?}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(written.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["run"]["run_id"], "over-tls", "{json}");
    assert!(written.join("index.html").exists());
}

//! Reflection for every client: the coordinator serves `grpc.reflection.v1`
//! and `v1alpha`. A client that speaks only v1alpha (grpcio-reflection's Python
//! client, from PyPI through `scripts/python-tools.sh`) lists and describes the
//! drove services with the token, and is refused without it.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The tools' Python: `DROVE_TOOLS_PYTHON` (set by `scripts/test.sh`), else the
/// one `scripts/python-tools.sh` makes (or finds) under `target/`.
fn tools_python() -> PathBuf {
    if let Some(p) = std::env::var_os("DROVE_TOOLS_PYTHON") {
        return p.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("bash")
        .arg(root.join("scripts/python-tools.sh"))
        .output()
        .expect("running scripts/python-tools.sh");
    assert!(
        out.status.success(),
        "scripts/python-tools.sh could not install the Python gRPC tools from PyPI:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn reflect(python: &PathBuf, addr: &str, token: Option<&str>) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/reflect_v1alpha.py");
    let mut cmd = Command::new(python);
    cmd.arg(script).arg(addr).args(token);
    let out = cmd.output().expect("running the v1alpha client");
    assert!(out.status.success(), "the client failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_speaks_only_v1alpha_lists_and_describes_the_drove_services() {
    let python = tokio::task::spawn_blocking(tools_python).await.unwrap();
    let store = tempfile::tempdir().unwrap();
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: store.path().to_path_buf(),
        token: Some("tok".into()),
        ..Default::default()
    };
    let server = drove_coordinator::start(&config).await.unwrap();
    let addr = server.addr().to_string();

    let (p, a) = (python.clone(), addr.clone());
    let with = tokio::task::spawn_blocking(move || reflect(&p, &a, Some("tok"))).await.unwrap();
    let services: Vec<&str> = with["services"]
        .as_array()
        .unwrap_or_else(|| panic!("no service list: {with}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for s in ["drove.v1.Rendezvous", "drove.v1.Weights", "drove.v1.Metrics", "grpc.health.v1.Health"] {
        assert!(services.contains(&s), "{s} missing from {services:?}");
    }
    assert!(services.iter().any(|s| s.contains("v1alpha")), "v1alpha itself is listed: {services:?}");
    assert_eq!(
        with["described"]["drove.v1.Rendezvous"]["Join"],
        serde_json::json!(["drove.v1.JoinRequest", "drove.v1.JoinResponse"]),
        "{with}"
    );
    assert!(with["described"]["drove.v1.Metrics"]["Push"].is_array(), "{with}");

    for token in [None, Some("wrong")] {
        let (p, a) = (python.clone(), addr.clone());
        let without = tokio::task::spawn_blocking(move || reflect(&p, &a, token)).await.unwrap();
        assert_eq!(without["error"], "UNAUTHENTICATED", "{token:?}: {without}");
    }
    server.shutdown().await;
}

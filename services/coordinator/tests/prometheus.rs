//! Prometheus: a scrape of the coordinator's `/metrics`, parsed with a real
//! Prometheus text parser (`prometheus_client`'s, from PyPI through
//! `scripts/python-tools.sh`), holds the values pushed: the latest value of each
//! metric of each rank of a running run, its diversity alarm, its world size
//! and generation at its latest step, and the coordinator's own counters; a
//! finished run's metrics are not exported.

use std::path::PathBuf;
use std::process::Command;

use drove_control::Clients;
use drove_proto::v1::{JoinRequest, LeaveRequest, MetricPoint, PushRequest, RunEvent};
use serde_json::Value;

fn tools_python() -> PathBuf {
    if let Some(p) = std::env::var_os("DROVE_TOOLS_PYTHON") {
        return p.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out =
        Command::new("bash").arg(root.join("scripts/python-tools.sh")).output().expect("python-tools.sh");
    assert!(out.status.success(), "python-tools.sh: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn scrape(python: &PathBuf, url: &str) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/scrape_prometheus.py");
    let out = Command::new(python).arg(script).arg(url).output().expect("running the scraper");
    assert!(out.status.success(), "the scrape failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn point(run: &str, rank: i32, step: f64, name: &str, value: f64) -> MetricPoint {
    MetricPoint { run_id: run.into(), rank, step, name: name.into(), value, wall_time_unix_ms: 0 }
}

async fn join(c: &mut Clients, run: &str, rank: i32, world: i32) {
    let req = JoinRequest {
        run_id: run.into(),
        world_size: world,
        address: format!("127.0.0.1:{}", 30000 + rank),
        host: "h".into(),
        requested_rank: rank,
        timeout_ms: 10_000,
        restart_count: 0,
        ..Default::default()
    };
    c.rendezvous.join(req).await.expect("join");
}

/// The value of the one sample `name` whose labels include `labels`.
fn sample(scrape: &Value, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let hits: Vec<&Value> = scrape["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["name"] == name && labels.iter().all(|(k, v)| s["labels"][k] == *v))
        .collect();
    assert!(hits.len() <= 1, "{name} {labels:?} appears {} times", hits.len());
    hits.first().map(|s| s["value"].as_f64().expect("a finite value"))
}

/// A coordinator on a temporary store serving Prometheus too: the store (kept
/// while the test runs), the server and its `/metrics` URL.
async fn serve_metrics() -> (tempfile::TempDir, drove_coordinator::Server, String) {
    let store = tempfile::tempdir().unwrap();
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        store: store.path().to_path_buf(),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        ..Default::default()
    };
    let server = drove_coordinator::start(&config).await.unwrap();
    let url = format!("http://{}/metrics", server.metrics_addr().expect("metrics served"));
    (store, server, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_holds_the_latest_values_the_alarm_and_the_counters() {
    let python = tokio::task::spawn_blocking(tools_python).await.unwrap();
    let (_store, server, url) = serve_metrics().await;
    let mut c = Clients::connect(&server.addr().to_string(), None).await.unwrap();

    // "live": two ranks running; "done": a run that has ended.
    let addr = server.addr().to_string();
    let (mut c0, mut c1) =
        (Clients::connect(&addr, None).await.unwrap(), Clients::connect(&addr, None).await.unwrap());
    tokio::join!(join(&mut c0, "live", 0, 2), join(&mut c1, "live", 1, 2));
    join(&mut c, "done", 0, 1).await;
    let points = vec![
        point("live", 0, 1.0, "loss", 2.5),
        point("live", 0, 2.0, "loss", 2.25),
        point("live", 1, 1.0, "loss", 2.75),
        point("live", 1, 2.0, "loss", 2.125),
        point("live", 0, 2.0, "lr", 5e-5),
        point("done", 0, 1.0, "loss", 9.0),
    ];
    let stream = tokio_stream::iter(vec![PushRequest { points }]);
    let mut acks = c.metrics.push(stream).await.unwrap().into_inner();
    while acks.message().await.unwrap().is_some() {}
    c.rendezvous
        .leave(LeaveRequest { run_id: "done".into(), rank: 0, error: String::new(), ..Default::default() })
        .await
        .unwrap();
    let alarm = RunEvent {
        run_id: "live".into(),
        rank: 0,
        step: 2.0,
        kind: "diversity_alarm".into(),
        message: "Identical masks".into(),
        wall_time_unix_ms: 0,
    };
    c.metrics.record_event(alarm).await.unwrap();

    let (p, u) = (python.clone(), url.clone());
    let s = tokio::task::spawn_blocking(move || scrape(&p, &u)).await.unwrap();
    assert!(s["content_type"].as_str().unwrap().starts_with("text/plain; version=0.0.4"), "{s}");
    assert_eq!(s["families"]["drove_metric"], "gauge", "{s}");
    assert_eq!(s["families"]["drove_points_ingested"], "counter", "{s}");
    let m = |rank: &str, name: &str| {
        sample(&s, "drove_metric", &[("run", "live"), ("rank", rank), ("name", name)])
    };
    assert_eq!(m("0", "loss"), Some(2.25), "the latest step's value: {s}");
    assert_eq!(m("1", "loss"), Some(2.125), "{s}");
    assert_eq!(m("0", "lr"), Some(5e-5), "{s}");
    assert_eq!(m("1", "lr"), None, "rank 1 recorded no lr: {s}");
    assert_eq!(sample(&s, "drove_metric", &[("run", "done")]), None, "an ended run is not exported: {s}");
    assert_eq!(sample(&s, "drove_diversity_alarm", &[("run", "live")]), Some(1.0), "{s}");
    assert_eq!(sample(&s, "drove_runs", &[("state", "running")]), Some(1.0), "{s}");
    assert_eq!(sample(&s, "drove_runs", &[("state", "finished")]), Some(1.0), "{s}");
    assert_eq!(sample(&s, "drove_points_ingested_total", &[]), Some(6.0), "{s}");
    assert_eq!(sample(&s, "drove_pushes_total", &[]), Some(1.0), "{s}");
    assert_eq!(sample(&s, "drove_blob_bytes", &[]), Some(0.0), "{s}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_run_exports_its_world_size_and_generation_at_its_latest_step() {
    let python = tokio::task::spawn_blocking(tools_python).await.unwrap();
    let (_store, server, url) = serve_metrics().await;
    let addr = server.addr().to_string();
    let (mut c0, mut c1) =
        (Clients::connect(&addr, None).await.unwrap(), Clients::connect(&addr, None).await.unwrap());
    tokio::join!(join(&mut c0, "elastic", 0, 2), join(&mut c1, "elastic", 1, 2));

    // Generation 1 had 3 ranks up to step 4; generation 2 has 2 from step 5.
    // Rank 2's step-4 points arrive last: the latest point of that rank, but
    // not of the run's latest step.
    let mut points = Vec::new();
    for rank in 0..2 {
        for (step, world, generation) in [(4.0, 3.0, 1.0), (5.0, 2.0, 2.0), (6.0, 2.0, 2.0)] {
            points.push(point("elastic", rank, step, "world_size", world));
            points.push(point("elastic", rank, step, "generation", generation));
        }
    }
    points.push(point("elastic", 2, 4.0, "world_size", 3.0));
    points.push(point("elastic", 2, 4.0, "generation", 1.0));
    let stream = tokio_stream::iter(vec![PushRequest { points }]);
    let mut acks = c0.metrics.push(stream).await.unwrap().into_inner();
    while acks.message().await.unwrap().is_some() {}

    let s = tokio::task::spawn_blocking(move || scrape(&python, &url)).await.unwrap();
    assert_eq!(s["families"]["drove_run_world_size"], "gauge", "{s}");
    assert_eq!(s["families"]["drove_run_generation"], "gauge", "{s}");
    assert_eq!(sample(&s, "drove_run_world_size", &[("run", "elastic")]), Some(2.0), "{s}");
    assert_eq!(sample(&s, "drove_run_generation", &[("run", "elastic")]), Some(2.0), "{s}");
    // Each rank's latest value is still there as drove_metric.
    let m = sample(&s, "drove_metric", &[("run", "elastic"), ("rank", "2"), ("name", "world_size")]);
    assert_eq!(m, Some(3.0), "{s}");
    server.shutdown().await;
}

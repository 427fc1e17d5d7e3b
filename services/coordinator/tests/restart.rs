//! The real `drove-coordinator` process: killed with SIGKILL and restarted on the
//! same store, it still has every point it acknowledged.
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use drove_proto::client::Clients;
use drove_proto::v1::{Aggregation, MetricPoint, PushRequest, QueryRequest};

struct Coordinator(Child);

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary on a free port and reads the address it prints.
fn start(store: &std::path::Path) -> (Coordinator, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_drove-coordinator"))
        .args(["--listen", "127.0.0.1:0", "--store"])
        .arg(store)
        .env_remove("DROVE_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting drove-coordinator");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("drove-coordinator listening on ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .to_string();
    (Coordinator(child), addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_points_survive_sigkill_and_restart() {
    let store = tempfile::tempdir().unwrap();
    let (mut first, addr) = start(store.path());
    let mut c = Clients::connect(&addr, None).await.unwrap();
    let batches: Vec<PushRequest> = (0..20)
        .map(|b| PushRequest {
            points: (0..500)
                .map(|i| MetricPoint {
                    run_id: "durable".into(),
                    rank: i % 4,
                    step: (b * 125 + i / 4) as f64,
                    name: "loss".into(),
                    value: (b * 500 + i) as f64,
                    wall_time_unix_ms: 0,
                })
                .collect(),
        })
        .collect();
    let mut acks = c.metrics.push(tokio_stream::iter(batches)).await.unwrap().into_inner();
    let mut acked = 0;
    while let Some(a) = acks.message().await.unwrap() {
        acked = a.stored;
    }
    assert_eq!(acked, 10_000);
    // SIGKILL: no chance to flush anything.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let (_second, addr) = start(store.path());
    let mut c = Clients::connect(&addr, None).await.unwrap();
    let q =
        QueryRequest { run_id: "durable".into(), aggregation: Aggregation::Raw as i32, ..Default::default() };
    let points = c.metrics.query(q).await.unwrap().into_inner().points;
    assert_eq!(points.len(), 10_000);
    let mut values: Vec<i64> = points.iter().map(|p| p.value as i64).collect();
    values.sort_unstable();
    assert_eq!(values, (0..10_000).collect::<Vec<_>>());
}

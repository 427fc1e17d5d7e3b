//! The recorder against a real coordinator on loopback (in-process gRPC
//! server on a store folder): points delivered once each, a coordinator that
//! is down when recording starts and one stopped and restarted on the same
//! store and port mid-run both get every point exactly once, and a coordinator
//! that never comes back costs only the bounded flush wait.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use drove_metrics::{MetricsRecorder, Reading, RecorderOptions, RecorderTarget};
use drove_proto::v1::{Aggregation, QueryRequest};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn start(rt: &tokio::runtime::Runtime, store: &Path, listen: SocketAddr) -> drove_coordinator::Server {
    let config = drove_coordinator::Config { listen, store: store.to_path_buf(), ..Default::default() };
    rt.block_on(drove_coordinator::start(&config)).expect("a coordinator")
}

/// A port free now (bound, then released).
fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// (rank, step) of every raw `name` point of `run`.
fn stored(rt: &tokio::runtime::Runtime, addr: SocketAddr, run: &str, name: &str) -> Vec<(i32, f64)> {
    rt.block_on(async {
        let mut c = drove_control::Clients::connect(&addr.to_string(), None).await.unwrap();
        let resp = c
            .metrics
            .query(QueryRequest {
                run_id: run.into(),
                name: name.into(),
                aggregation: Aggregation::Raw as i32,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        resp.points.iter().map(|p| (p.rank, p.step)).collect()
    })
}

fn quick() -> RecorderOptions {
    RecorderOptions {
        batch: 16,
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        flush_timeout: Duration::from_secs(30),
        ..RecorderOptions::default()
    }
}

#[test]
fn points_are_stored_once_even_when_sent_twice() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let server = start(&rt, dir.path(), "127.0.0.1:0".parse().unwrap());
    let addr = server.addr();
    let r = MetricsRecorder::new(
        RecorderTarget { address: &addr.to_string(), token: None, run_id: "once", rank: 3 },
        quick(),
    )
    .unwrap();
    for step in 1..=100 {
        r.record(Reading { step: step as f64, name: "loss", value: 1.0 / step as f64 });
    }
    // The same (rank, name, step) again, as a resend would: acknowledged, not stored.
    for step in 1..=10 {
        r.record(Reading { step: step as f64, name: "loss", value: 99.0 });
    }
    let d = r.close();
    assert_eq!((d.recorded, d.delivered, d.duplicates, d.undelivered()), (110, 110, 10, 0), "{d:?}");
    let points = stored(&rt, addr, "once", "loss");
    assert_eq!(points.len(), 100);
    assert_eq!(points, (1..=100).map(|s| (3, s as f64)).collect::<Vec<_>>());
    rt.block_on(server.shutdown());
}

#[test]
fn a_coordinator_restarted_on_its_store_and_port_gets_every_point_once() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    // Down when recording starts: the first pushes fail and are retried.
    let r = MetricsRecorder::new(
        RecorderTarget { address: &addr.to_string(), token: None, run_id: "restart", rank: 0 },
        quick(),
    )
    .unwrap();
    for step in 1..=50 {
        r.record(Reading { step: step as f64, name: "loss", value: 1.0 });
    }
    let server = start(&rt, dir.path(), addr);
    r.flush(Duration::from_secs(30)).expect("delivered once the coordinator is up");
    rt.block_on(server.shutdown());
    // Down again, mid-run: points wait in the buffer.
    for step in 51..=120 {
        r.record(Reading { step: step as f64, name: "loss", value: 1.0 });
    }
    let waiting = r.delivery();
    assert_eq!(waiting.delivered, 50, "{waiting:?}");
    let server = start(&rt, dir.path(), addr);
    let d = r.close();
    assert_eq!((d.delivered, d.undelivered()), (120, 0), "{d:?}");
    let points = stored(&rt, addr, "restart", "loss");
    assert_eq!(points, (1..=120).map(|s| (0, s as f64)).collect::<Vec<_>>(), "each step once");
    rt.block_on(server.shutdown());
}

#[test]
fn a_coordinator_gone_for_good_costs_only_the_flush_wait() {
    let addr = free_port();
    let options = RecorderOptions { flush_timeout: Duration::from_millis(800), ..quick() };
    let r = MetricsRecorder::new(
        RecorderTarget { address: &addr.to_string(), token: None, run_id: "gone", rank: 1 },
        options,
    )
    .unwrap();
    for step in 1..=30 {
        r.record(Reading { step: step as f64, name: "loss", value: 1.0 });
    }
    let started = Instant::now();
    let d = r.close();
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!((d.delivered, d.undelivered()), (0, 30), "{d:?}");
    let text = d.to_string();
    assert!(text.contains("30 not delivered") && text.contains(&addr.to_string()), "{text}");
    assert!(d.last_error.is_some(), "the cause is kept: {d:?}");
}

//! Prometheus: the text exposition format (version 0.0.4) at `/metrics` on
//! `metrics_listen`, for scraping by Prometheus in a cluster.
//!
//! - `drove_metric{run, rank, name}`: for every running run and rank, the
//!   latest value of every metric it recorded (a gauge);
//! - `drove_diversity_alarm{run}`: 1 when the run's diversity alarm went off;
//! - `drove_run_world_size{run}` and `drove_run_generation{run}`: for every
//!   running run, the `world_size` and `generation` metrics at the latest step
//!   any rank recorded them, the largest across ranks there (from the points,
//!   not the coordinator's generations, so a fixed-world run that records them
//!   has them too; the latest step rather than each rank's latest point,
//!   since a rank left out of a smaller world keeps its old world's value);
//! - the coordinator's own: `drove_points_ingested_total`, `drove_pushes_total`
//!   (since start), `drove_runs{state}`, `drove_blobs` and `drove_blob_bytes`.
//!
//! A minimal HTTP/1.1 server: one request per connection, `GET /metrics`
//! answered, anything else 404; every read has a deadline.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use drove_proto::metric_names;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::run_state::RunState;
use crate::store::{Agg, Filter, RunRow, Store, StoreError};

/// Counters the services bump as they work.
#[derive(Debug, Default)]
pub struct Counters {
    /// Metric points stored (duplicates not counted).
    pub points_ingested: AtomicU64,
    /// Push streams opened.
    pub pushes: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A label value, escaped as the text format wants (`\\`, `\"`, `\n`).
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A sample value: Prometheus spells the non-finite ones `NaN`, `+Inf`, `-Inf`.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

/// The exposition of everything the store and the counters hold now.
pub fn render(store: &Store, counters: &Counters) -> Result<String, StoreError> {
    let mut out = String::new();
    let w = &mut out;
    let latest = store.latest_of_running()?;
    let _ = writeln!(w, "# HELP drove_metric The latest value of a metric of a rank of a running run.");
    let _ = writeln!(w, "# TYPE drove_metric gauge");
    for (run, rank, name, value) in &latest {
        let _ = writeln!(
            w,
            "drove_metric{{run=\"{}\",rank=\"{rank}\",name=\"{}\"}} {}",
            label(run),
            label(name),
            number(*value)
        );
    }
    let runs = store.runs()?;
    let events = store.events()?;
    let _ = writeln!(
        w,
        "# HELP drove_diversity_alarm 1 when the run's masks were found identical (or anti-correlated) across ranks."
    );
    let _ = writeln!(w, "# TYPE drove_diversity_alarm gauge");
    for r in runs.iter().filter(|r| r.state == Some(RunState::Running)) {
        let raised = events
            .get(&r.run_id)
            .is_some_and(|e| e.iter().any(|e| e.kind == metric_names::event::DIVERSITY_ALARM));
        let _ = writeln!(w, "drove_diversity_alarm{{run=\"{}\"}} {}", label(&r.run_id), u8::from(raised));
    }
    world_gauges(w, store, &runs)?;
    let _ = writeln!(w, "# HELP drove_runs Runs the coordinator knows, by state.");
    let _ = writeln!(w, "# TYPE drove_runs gauge");
    let mut states: Vec<(&str, usize)> = Vec::new();
    for r in &runs {
        let state = r.listed_state().word();
        match states.iter_mut().find(|(s, _)| *s == state) {
            Some((_, n)) => *n += 1,
            None => states.push((state, 1)),
        }
    }
    states.sort_unstable();
    for (state, n) in states {
        let _ = writeln!(w, "drove_runs{{state=\"{}\"}} {n}", label(state));
    }
    let blobs = store.blobs()?;
    let _ = writeln!(w, "# HELP drove_blobs Blobs (initial weights) stored.");
    let _ = writeln!(w, "# TYPE drove_blobs gauge");
    let _ = writeln!(w, "drove_blobs {}", blobs.len());
    let _ = writeln!(w, "# HELP drove_blob_bytes Bytes of the blobs stored.");
    let _ = writeln!(w, "# TYPE drove_blob_bytes gauge");
    let _ = writeln!(w, "drove_blob_bytes {}", blobs.iter().map(|b| b.size).sum::<u64>());
    let _ =
        writeln!(w, "# HELP drove_points_ingested_total Metric points stored since the coordinator started.");
    let _ = writeln!(w, "# TYPE drove_points_ingested_total counter");
    let _ = writeln!(w, "drove_points_ingested_total {}", counters.points_ingested.load(Ordering::Relaxed));
    let _ = writeln!(w, "# HELP drove_pushes_total Metric push streams since the coordinator started.");
    let _ = writeln!(w, "# TYPE drove_pushes_total counter");
    let _ = writeln!(w, "drove_pushes_total {}", counters.pushes.load(Ordering::Relaxed));
    Ok(out)
}

/// The value of metric `name` of `run_id` at the latest step it was recorded
/// at, the largest across the ranks that recorded it there.
fn latest_max(store: &Store, run_id: &str, name: &str) -> Result<Option<f64>, StoreError> {
    let filter = Filter { run_id: run_id.to_string(), name: Some(name.to_string()), ..Filter::default() };
    Ok(store.aggregate(&filter, Agg::Max)?.last().map(|row| row.value))
}

/// `drove_run_world_size` and `drove_run_generation` of the running `runs`
/// that recorded them.
fn world_gauges(w: &mut String, store: &Store, runs: &[RunRow]) -> Result<(), StoreError> {
    let running: Vec<&RunRow> = runs.iter().filter(|r| r.state == Some(RunState::Running)).collect();
    for (gauge, metric, help) in [
        ("drove_run_world_size", metric_names::WORLD_SIZE, "The ranks of a running run at its latest step."),
        (
            "drove_run_generation",
            metric_names::GENERATION,
            "The generation (world) of a running elastic run at its latest step; 0 for a fixed world.",
        ),
    ] {
        let _ = writeln!(w, "# HELP {gauge} {help}");
        let _ = writeln!(w, "# TYPE {gauge} gauge");
        for r in &running {
            if let Some(value) = latest_max(store, &r.run_id, metric)? {
                let _ = writeln!(w, "{gauge}{{run=\"{}\"}} {}", label(&r.run_id), number(value));
            }
        }
    }
    Ok(())
}

/// Serves `/metrics` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, store: Store, counters: Arc<Counters>) {
    loop {
        let Ok((mut conn, peer)) = listener.accept().await else { continue };
        let (store, counters) = (store.clone(), counters.clone());
        tokio::spawn(async move {
            if let Err(e) = answer(&mut conn, store, counters).await {
                tracing::debug!(%peer, "metrics scrape: {e}");
            }
        });
    }
}

async fn answer(
    conn: &mut tokio::net::TcpStream,
    store: Store,
    counters: Arc<Counters>,
) -> std::io::Result<()> {
    // The request head, within 10 s and 16 KiB.
    let mut head = Vec::with_capacity(1024);
    let read = async {
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
            let n = conn.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no request within 10 s"))??;
    let line = String::from_utf8_lossy(head.split(|&b| b == b'\r').next().unwrap_or_default()).into_owned();
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, kind, body) = if method != "GET" {
        (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            format!("{method} is not supported: GET /metrics\n"),
        )
    } else if path != "/metrics" {
        ("404 Not Found", "text/plain; charset=utf-8", format!("no {path}: the metrics are at /metrics\n"))
    } else {
        match tokio::task::spawn_blocking(move || render(&store, &counters)).await {
            Ok(Ok(text)) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", text),
            Ok(Err(e)) => ("500 Internal Server Error", "text/plain; charset=utf-8", format!("{e}\n")),
            Err(e) => ("500 Internal Server Error", "text/plain; charset=utf-8", format!("{e}\n")),
        }
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(response.as_bytes()).await?;
    conn.shutdown().await
}

/// Binds `addr` for [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

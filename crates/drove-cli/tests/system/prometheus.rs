//! Prometheus under `drove run`: with `--metrics-listen` the in-process
//! coordinator serves `/metrics` as `drove coordinator --metrics-listen` does,
//! for any program under it. The ranks here are not `drove train ner` but this
//! test binary, a program of the user's through `drove_launch`'s public API:
//! each records a metric, then waits on a FIFO of its own until the test has
//! scraped it over a real HTTP GET on loopback (polled with a deadline; no
//! sleeps). Bad addresses are refused naming the flag or the address.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{DROVE, Proc};

/// Set in the ranks' environment: this test binary is a rank, not a test run.
const CHILD: &str = "DROVE_TEST_PROMETHEUS_RANK";
/// The folder of the ranks' FIFOs (`go-RANK`).
const GO_DIR: &str = "DROVE_TEST_PROMETHEUS_GO";
/// The metric each rank records, and its step.
const METRIC: &str = "watched";
const STEP: u64 = 7;
/// Long enough for a loaded machine; a hang still ends the test.
const DEADLINE: Duration = Duration::from_secs(120);

/// The value rank `rank` records.
fn recorded(rank: usize) -> f64 {
    10.0 * rank as f64 + 0.25
}

/// Not a test of its own: the rank program of the test below, which launches
/// this test binary with only this test selected. Joins the world, records
/// [`METRIC`], and stays in the run until the test opens its FIFO.
#[test]
fn a_rank_that_records_and_waits_for_the_test() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let world = drove_launch::Launched::join().expect("joining the world");
    let rank = world.rank();
    world.record(STEP, METRIC, recorded(rank));
    world.flush(DEADLINE).expect("delivering the point");
    let go = Path::new(&std::env::var_os(GO_DIR).expect("the FIFO folder")).join(format!("go-{rank}"));
    // Blocks until the test opens the FIFO for writing, then reads its line.
    let said = std::fs::read_to_string(&go).expect("reading the FIFO");
    assert_eq!(said, "go\n");
    world.finish(drove_launch::RankOutcome::Finished { steps: STEP });
}

/// `GET /metrics` on `addr` over loopback: the status line and the body.
fn get(addr: &str) -> std::io::Result<(String, String)> {
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: drove\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    conn.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((head.lines().next().unwrap_or_default().to_string(), body.to_string()))
}

/// The value of the sample `name{labels}` in an exposition, if it is there.
fn sample(body: &str, name_and_labels: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.trim().parse().ok())
}

fn mkfifo(path: &Path) {
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

#[test]
fn drove_run_serves_prometheus_metrics_of_any_program_while_it_runs() {
    let go = tempfile::tempdir().unwrap();
    for rank in 0..2 {
        mkfifo(&go.path().join(format!("go-{rank}")));
    }
    let exe = std::env::current_exe().unwrap();
    let mut proc = Proc::spawn(
        Command::new(DROVE)
            .args(["run", "--np", "2", "--run-id", "prom", "--metrics-listen", "127.0.0.1:0", "--"])
            .arg(exe)
            .args(["--exact", "prometheus::a_rank_that_records_and_waits_for_the_test", "--nocapture"])
            .env(CHILD, "1")
            .env(GO_DIR, go.path())
            .env("RUST_LOG", "warn"),
    );
    let said = "the coordinator serves Prometheus metrics at http://";
    assert!(proc.stderr_until(DEADLINE, |l| l.contains(said)), "no address: {}", proc.stderr_now());
    let line = proc.err.last().unwrap().clone();
    let addr = line.split(said).nth(1).and_then(|r| r.strip_suffix("/metrics")).unwrap().to_string();
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{line}");

    // Both ranks' points arrive while the run goes on: poll until they do.
    let until = Instant::now() + DEADLINE;
    let body = loop {
        let (status, body) = get(&addr).unwrap_or_else(|e| panic!("GET http://{addr}/metrics: {e}"));
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        let of = |rank: usize| {
            sample(&body, &format!("drove_metric{{run=\"prom\",rank=\"{rank}\",name=\"{METRIC}\"}}"))
        };
        if of(0).is_some() && of(1).is_some() {
            break body;
        }
        assert!(
            Instant::now() < until,
            "no point of both ranks within {DEADLINE:?}:\n{body}\n{}",
            proc.stderr_now()
        );
    };
    for rank in 0..2 {
        let labels = format!("drove_metric{{run=\"prom\",rank=\"{rank}\",name=\"{METRIC}\"}}");
        assert_eq!(sample(&body, &labels), Some(recorded(rank)), "{body}");
    }
    assert_eq!(sample(&body, "drove_diversity_alarm{run=\"prom\"}"), Some(0.0), "{body}");
    assert_eq!(sample(&body, "drove_runs{state=\"running\"}"), Some(1.0), "{body}");
    assert!(sample(&body, "drove_points_ingested_total").is_some_and(|n| n >= 2.0), "{body}");

    // Let the ranks finish: opening each FIFO waits for its rank to read it.
    for rank in 0..2 {
        std::fs::write(go.path().join(format!("go-{rank}")), "go\n").unwrap();
    }
    let (status, _, err) = proc.finish(DEADLINE);
    assert!(status.success(), "{status}\n{err}");
}

#[test]
fn metrics_listen_is_refused_with_a_running_coordinator_and_on_a_taken_address() {
    let (status, _, err) = Proc::drove(&[
        "run",
        "--np",
        "1",
        "--coordinator",
        "127.0.0.1:1",
        "--metrics-listen",
        "127.0.0.1:0",
        "--",
        "true",
    ])
    .finish(DEADLINE);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("--metrics-listen") && err.contains("--coordinator"), "{err}");

    let (status, _, err) =
        Proc::drove(&["run", "--np", "1", "--metrics-listen", "localhost-ish", "--", "true"])
            .finish(DEADLINE);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("--metrics-listen") && err.contains("localhost-ish"), "{err}");

    // Held for the whole call: the address is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap().to_string();
    let (status, _, err) =
        Proc::drove(&["run", "--np", "1", "--metrics-listen", &at, "--", "true"]).finish(DEADLINE);
    assert!(!status.success(), "{err}");
    assert!(err.contains(&at) && err.contains("in-process coordinator"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

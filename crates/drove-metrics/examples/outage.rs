//! A coordinator that goes away mid-run: points recorded while it is down wait
//! in the buffer and reach it once it is back on the same store and port.
//!
//! `cargo run -p drove-metrics --example outage`
use std::time::Duration;

use drove_metrics::{MetricsRecorder, Reading, RecorderOptions, RecorderTarget};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rt = tokio::runtime::Runtime::new()?;
    let store = tempfile::tempdir()?;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let config =
        drove_coordinator::Config { listen, store: store.path().to_path_buf(), ..Default::default() };
    let server = rt.block_on(drove_coordinator::start(&config))?;
    let options = RecorderOptions { max_backoff: Duration::from_millis(500), ..RecorderOptions::default() };
    let recorder = MetricsRecorder::new(
        RecorderTarget { address: &listen.to_string(), token: None, run_id: "outage-demo", rank: 0 },
        options,
    )?;
    for step in 1..=10 {
        recorder.record(Reading { step: step as f64, name: "loss", value: 1.0 / step as f64 });
    }
    recorder.flush(Duration::from_secs(10))?;
    rt.block_on(server.shutdown());
    println!("coordinator stopped after {}", recorder.delivery());
    for step in 11..=20 {
        recorder.record(Reading { step: step as f64, name: "loss", value: 1.0 / step as f64 });
    }
    let server = rt.block_on(drove_coordinator::start(&config))?;
    let delivery = recorder.close();
    println!("coordinator back: {delivery}");
    rt.block_on(server.shutdown());
    Ok(())
}

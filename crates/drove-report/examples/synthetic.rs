//! A report of a run made up in this program: two ranks whose loss falls,
//! masks diagnosed every fifth step (agreement near 0.745, the value of
//! independent masks at p = 0.15) and one evaluation per epoch.
//!
//! ```text
//! cargo run -p drove-report --example synthetic -- /tmp/drove-report
//! ```
//!
//! A real run's data comes from `RunData::from_store` (a folder kept by
//! `drove run --store DIR`) or `RunData::from_coordinator` instead.

use std::path::PathBuf;

use drove_report::{Event, Point, RunData, RunState};

fn point(name: &str, step: u32, rank: i32, value: f64) -> Point {
    Point { name: name.into(), step: f64::from(step), rank, value }
}

fn made_up_run() -> RunData {
    let mut points = Vec::new();
    for step in 1..=40u32 {
        for rank in 0..2 {
            let wobble = if rank == 0 { 0.02 } else { -0.02 };
            points.push(point("loss", step, rank, 2.0 / (1.0 + f64::from(step) / 10.0) + wobble));
            points.push(point("lr", step, rank, 5e-5 * (1.0 - f64::from(step) / 40.0)));
        }
        if step % 5 == 0 {
            let agreement = 0.745 + if step % 10 == 0 { 0.004 } else { -0.003 };
            points.push(point("mask_agreement", step, 0, agreement));
            points.push(point("mask_agreement_expected", step, 0, 0.745));
            points.push(point("mask_agreement_sigma", step, 0, 0.004));
        }
    }
    for (epoch, step, f1) in [(1, 20, 0.61), (2, 40, 0.74)] {
        points.push(point("epoch", step, 0, f64::from(epoch)));
        points.push(point("valid_f1", step, 0, f1));
    }
    let options = r#"{"seeding": "derived", "augment_mask": 0.15, "batch_size": 8, "epochs": 2}"#;
    RunData {
        run_id: "made-up".into(),
        state: RunState::Finished,
        world_size: 2,
        joined: 2,
        restarts: 0,
        created_unix_ms: 1_700_000_000_000,
        updated_unix_ms: 1_700_000_600_000,
        events: vec![Event {
            rank: 0,
            step: 0.0,
            kind: "options".into(),
            message: options.into(),
            wall_time_unix_ms: 1_700_000_000_000,
        }],
        points,
    }
}

fn main() -> Result<(), drove_report::ReportError> {
    let out = std::env::args_os()
        .nth(1)
        .map_or_else(|| std::env::temp_dir().join("drove-report-example"), PathBuf::from);
    let written = drove_report::write(&made_up_run(), &out)?;
    println!("wrote {}", written.index.display());
    println!("charts: {}", written.charts.join(", "));
    println!("verdict: {}", written.verdict.text);
    Ok(())
}

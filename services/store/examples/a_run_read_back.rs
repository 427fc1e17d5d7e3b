//! A run recorded the way the coordinator records it (its state, each rank's
//! loss at each step), then read back by a second, read-only handle the way
//! `drove report` reads a live run: the mean loss across ranks at each step.
//!
//! ```text
//! cargo run -p drove-store --example a_run_read_back
//! ```

use drove_store::{Agg, Filter, PointRow, RunState, Store};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let writer = Store::open(dir.path())?;
    writer.upsert_run("demo", RunState::Running, 2, 2)?;
    let loss = |rank: i32, step: f64, value: f64| PointRow {
        id: 0,
        run_id: "demo".into(),
        rank,
        step,
        name: "loss".into(),
        value,
        wall_ms: drove_store::now_ms(),
    };
    writer.insert_points(vec![loss(0, 1.0, 2.0), loss(1, 1.0, 2.2), loss(0, 2.0, 1.6), loss(1, 2.0, 1.8)])?;

    let reader = Store::open_read_only(dir.path())?;
    for run in reader.runs()? {
        println!("run {} ({} of {} ranks, {} points)", run.run_id, run.joined, run.world_size, run.points);
    }
    let losses = Filter { run_id: "demo".into(), name: Some("loss".into()), ..Filter::default() };
    for row in reader.aggregate(&losses, Agg::Mean)? {
        println!("step {}: mean loss {:.2} over {} ranks", row.step, row.value, row.count);
    }
    Ok(())
}

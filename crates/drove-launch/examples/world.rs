//! Both sides of the launch contract in one program: run alone, it launches
//! two copies of itself through `drove_launch::launch`; launched, each copy
//! joins the world, sums the ranks with an all-reduce, records it as a metric
//! on the launcher's coordinator, and reports progress.
//!
//! ```text
//! cargo run -p drove-launch --example world
//! ```

use std::sync::Arc;

use drove_collective::{Element as _, ReduceOptions};
use drove_launch::{LaunchEnv, LaunchSpec, Launched, PlainConsole, Progress, RankOutcome, launch};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if LaunchEnv::from_env()?.under_launcher() {
        return rank();
    }
    let spec = LaunchSpec::new(2, std::env::current_exe()?, Vec::<String>::new());
    let outcome = launch(&spec, Arc::new(PlainConsole))?;
    println!("run {} ended: {:?} (exit code {})", outcome.run_id, outcome.end, outcome.exit_code());
    std::process::exit(outcome.exit_code().into());
}

fn rank() -> Result<(), Box<dyn std::error::Error>> {
    let world = Launched::join()?;
    let mut sum = [world.rank() as i64];
    world.comm().all_reduce("ranks", &[1], i64::tensor_mut(&mut sum), ReduceOptions::sum())?;
    world.record(1, "sum_of_ranks", sum[0] as f64);
    world.progress(&Progress::at(1, 1));
    println!("rank {} of {}: sum of ranks = {}", world.rank(), world.world_size(), sum[0]);
    world.finish(RankOutcome::Finished { steps: 1 });
    Ok(())
}

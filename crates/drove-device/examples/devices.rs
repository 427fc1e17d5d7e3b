//! Opens the device named on the command line (`cpu`, `cuda[:N]`, `wgpu[:N]`
//! or `help`) and averages a bucket of gradients across two ranks (threads
//! over drove-collective's in-process world) through host staging, the seam a
//! trainer hands its buckets to.
//!
//! ```text
//! cargo run -p drove-device --example devices -- cpu
//! cargo run -p drove-device --features wgpu --example devices -- help
//! ```

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use drove_collective::fusion::Plan;
use drove_collective::{LocalWorld, ReduceOptions};
use drove_device::{BucketAllReduce, DeviceChoice, Gpu, HostStaging, read_back};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    let choice: DeviceChoice = arg.parse()?;
    match Gpu::open(choice, 0) {
        Ok(None) => println!("{choice}: the CPU, nothing to open"),
        Ok(Some(gpu)) => println!("{choice}: opened {}", gpu.describe()),
        Err(e) => println!("{choice}: {e}"),
    }
    let world = LocalWorld::new(2)?;
    let averaged = std::thread::scope(|s| {
        let ranks: Vec<_> = world
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let values: Vec<f32> = (0..4).map(|i| (rank * 4 + i) as f32).collect();
                    let gradient =
                        Tensor::<Flex, 1>::from_data(TensorData::new(values, [4]), &Default::default());
                    // One gradient, in one bucket: the plan a replica makes for it.
                    let plan = Plan::dense(&[16], 1 << 20);
                    let mut grads = vec![gradient];
                    HostStaging::default().all_reduce(
                        &comm,
                        "gradients",
                        &mut grads,
                        &plan,
                        ReduceOptions::average(),
                    )?;
                    read_back("gradients.bucket0", grads.remove(0))
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().expect("a rank panicked")).collect::<Result<Vec<_>, _>>()
    })?;
    println!("bucket averaged by host staging on both ranks: {:?}", averaged[0]);
    assert_eq!(averaged[0], averaged[1]);
    Ok(())
}

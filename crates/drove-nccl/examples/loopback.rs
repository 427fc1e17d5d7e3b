//! Three thread ranks average a tensor through `DeviceComm` on the in-process
//! `Loopback` device, with the CPU mesh checking each op first; then one rank
//! calls a different shape and every rank gets the same error.
//!
//!     cargo run -p drove-nccl --example loopback

use drove_collective::{DType, ReduceOptions};
use drove_comm::{CommOptions, Communicator, FileRendezvous};
use drove_nccl::{DeviceComm, DeviceOptions, DeviceSlice, LoopbackWorld};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let world = 3;
    let dir = tempfile::tempdir()?;
    let (_handle, devices) = LoopbackWorld::new(world);
    let ranks: Vec<_> = devices
        .into_iter()
        .enumerate()
        .map(|(rank, device)| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || -> Result<String, String> {
                let place = drove_collective::Place::new(rank, world).map_err(|e| e.to_string())?;
                let rv = FileRendezvous::new(&dir, place);
                let mesh = Communicator::connect(&rv, CommOptions::default()).map_err(|e| e.to_string())?;
                let comm = DeviceComm::connect(&mesh, device, DeviceOptions::default())
                    .map_err(|e| e.to_string())?;
                let mut grad = vec![rank as f32; 4];
                let slice = DeviceSlice { ptr: grad.as_mut_ptr() as u64, len: grad.len(), dtype: DType::F32 };
                // SAFETY: `grad` (host memory: the loopback device's memory) outlives the call.
                unsafe { comm.all_reduce(&mesh, "grad", slice, ReduceOptions::average()) }
                    .map_err(|e| e.to_string())?;
                let mut odd = vec![0.0f32; if rank == 1 { 3 } else { 4 }];
                let slice = DeviceSlice { ptr: odd.as_mut_ptr() as u64, len: odd.len(), dtype: DType::F32 };
                // SAFETY: as above.
                let mismatch = unsafe { comm.all_reduce(&mesh, "odd", slice, ReduceOptions::sum()) };
                Ok(format!(
                    "rank {rank}: average {grad:?}; then: {}",
                    mismatch.map_or_else(|e| e.to_string(), |_| "ok".into())
                ))
            })
        })
        .collect();
    for r in ranks {
        println!("{}", r.join().map_err(|_| "a rank panicked")??);
    }
    Ok(())
}

//! Four ranks as four threads of one process, on the seam alone: each
//! averages a gradient, gathers its rank, and then one rank calls an op
//! with another shape, and every rank gets the same error naming it.
//!
//! `cargo run -p drove-collective --example local_world`
use drove_collective::{Collective, Element, LocalWorld, ReduceOptions};

fn main() -> Result<(), drove_collective::CommError> {
    let ranks = LocalWorld::new(4)?;
    let lines = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|comm| {
                s.spawn(move || -> Result<String, drove_collective::CommError> {
                    let mut grad = vec![comm.rank() as f32; 8];
                    comm.all_reduce("grad", &[8], f32::tensor_mut(&mut grad), ReduceOptions::average())?;
                    let ids = comm.all_gather("ids", &[1], i64::tensor_ref(&[comm.rank() as i64]))?;
                    let n = if comm.rank() == 3 { 16 } else { 8 };
                    let mut odd = vec![0.0f32; n];
                    let mismatch =
                        comm.all_reduce("odd", &[n], f32::tensor_mut(&mut odd), ReduceOptions::sum());
                    Ok(format!(
                        "rank {}: mean gradient {}, ranks gathered {:?}, then: {}",
                        comm.rank(),
                        grad[0],
                        i64::from_buffer(ids.data).unwrap_or_default(),
                        mismatch.err().map_or("no error".into(), |e| e.to_string())
                    ))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank thread")).collect::<Result<Vec<_>, _>>()
    })?;
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

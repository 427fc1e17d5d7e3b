//! Four ranks as four threads of one process, finding each other through a
//! temporary directory: each all-reduces a tensor filled with its rank, gathers
//! its rank id, and broadcasts from rank 2.
//!
//! `cargo run -p drove-comm --example allreduce_threads [-- tcp]`
use drove_collective::{Collective, Element, Place, ReduceOptions};
use drove_comm::{CommOptions, Communicator, FileRendezvous, Transport};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let world = 4;
    let dir = std::env::temp_dir().join(format!("drove-example-{}", std::process::id()));
    let transport =
        if std::env::args().nth(1).as_deref() == Some("tcp") { Transport::Tcp } else { Transport::Auto };
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let dir = dir.clone();
            std::thread::spawn(move || -> Result<String, drove_collective::CommError> {
                let rv = FileRendezvous::new(&dir, Place::new(rank, world)?);
                let comm = Communicator::connect(&rv, CommOptions { transport, ..CommOptions::default() })?;
                let mut t = vec![rank as f32; 1 << 20];
                comm.all_reduce("ranks", &[1 << 20], f32::tensor_mut(&mut t), ReduceOptions::sum())?;
                let g = comm.all_gather("ids", &[1], i64::tensor_ref(&[rank as i64]))?;
                let mut b = vec![rank as i32; 3];
                comm.broadcast("from2", &[3], i32::tensor_mut(&mut b), 2)?;
                Ok(format!(
                    "rank {rank} ({}): sum of ranks = {}, gathered {:?}, broadcast {:?}",
                    comm.transport(),
                    t[12345],
                    g.data,
                    b
                ))
            })
        })
        .collect();
    for h in handles {
        println!("{}", h.join().expect("rank thread")?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

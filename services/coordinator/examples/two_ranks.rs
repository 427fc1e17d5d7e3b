//! Two ranks find each other through a coordinator served in this process,
//! connect drove-comm's communicator over the peer table it hands out, and
//! all-reduce; each then leaves the run.
//!
//! `cargo run -p drove-coordinator --example two_ranks`
use drove_collective::{Collective, Element, Place, Rank, ReduceOptions};
use drove_comm::{CommOptions, Communicator, RankRequest};
use drove_control::CoordinatorRendezvous;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = tempfile::tempdir()?;
    let config = drove_coordinator::Config {
        listen: "127.0.0.1:0".parse()?,
        store: store.path().to_path_buf(),
        ..Default::default()
    };
    let server = drove_control::runtime::block_on(drove_coordinator::start(&config))??;
    let addr = server.addr().to_string();
    println!("coordinator on {addr}");
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let addr = addr.clone();
            std::thread::spawn(move || -> Result<String, drove_collective::CommError> {
                let request = RankRequest::Given(Place::new(rank, 2)?);
                let rendezvous = CoordinatorRendezvous::new(&addr, "example", request, None)?.heartbeat(None);
                let comm = Communicator::connect(&rendezvous, CommOptions::default())?;
                let mut x = vec![(rank + 1) as f32; 4];
                comm.all_reduce("x", &[4], f32::tensor_mut(&mut x), ReduceOptions::sum())?;
                rendezvous.leave(Rank::new(rank), None)?;
                Ok(format!("rank {rank} of {} over {}: sum {}", comm.world_size(), comm.transport(), x[0]))
            })
        })
        .collect();
    for rank in ranks {
        println!("{}", rank.join().expect("a rank thread")?);
    }
    drove_control::runtime::block_on(server.shutdown())?;
    Ok(())
}

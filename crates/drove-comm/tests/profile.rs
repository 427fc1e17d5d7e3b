//! The TCP ring's profile: 3 thread ranks on loopback, one all-reduce of
//! 1 MiB of f32 profiled, every ring step accounted for.

use std::time::Duration;

use drove_collective::{Collective, Element, Place, ReduceOptions};
use drove_comm::{CommOptions, Communicator, FileRendezvous, Transport};

#[test]
fn a_profiled_all_reduce_accounts_for_every_ring_step_and_its_bytes() {
    const N: usize = 3;
    const LEN: usize = 1 << 18; // 1 MiB of f32
    let dir = tempfile::tempdir().unwrap();
    let threads: Vec<_> = (0..N)
        .map(|rank| {
            let dir = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let rv = FileRendezvous::new(&dir, Place::new(rank, N).unwrap());
                let opts = CommOptions {
                    transport: Transport::Tcp,
                    timeout: Duration::from_secs(30),
                    ..CommOptions::default()
                };
                let comm = Communicator::connect(&rv, opts).unwrap();
                let mut v = vec![1.0f32; LEN];
                comm.all_reduce("unprofiled", &[LEN], f32::tensor_mut(&mut v), ReduceOptions::sum()).unwrap();
                assert!(comm.take_ring_profile().is_empty(), "nothing is recorded before profiling starts");
                comm.set_ring_profile(true);
                comm.all_reduce("profiled", &[LEN], f32::tensor_mut(&mut v), ReduceOptions::sum()).unwrap();
                let steps = comm.take_ring_profile();
                comm.set_ring_profile(false);
                (v[0], steps)
            })
        })
        .collect();
    let mut all_bytes = 0;
    for (rank, t) in threads.into_iter().enumerate() {
        let (first, steps) = t.join().expect("a rank");
        assert_eq!(first, 9.0, "1 summed over 3 ranks, twice");
        let names: Vec<(&str, usize)> = steps.iter().map(|s| (s.phase, s.step)).collect();
        assert_eq!(
            names,
            [("reduce-scatter", 0), ("reduce-scatter", 1), ("all-gather", 0), ("all-gather", 1)],
            "rank {rank}"
        );
        // Each step sends one segment, a third of the buffer (up to an element).
        let bytes: u64 = steps.iter().map(|s| s.bytes).sum();
        all_bytes += bytes;
        let third = (LEN / N * 4) as u64;
        assert!((4 * third..=4 * (third + 4)).contains(&bytes), "rank {rank}: {bytes} bytes");
        for s in &steps {
            assert_eq!(s.ops, 1, "{s:?}");
            assert!(s.sends > 0 && s.total >= s.send + s.recv + s.wait, "{s:?}");
            assert_eq!(s.reduce.is_zero(), s.phase == "all-gather", "only reduce-scatter reduces: {s:?}");
        }
    }
    // Over the ring, every step moves the whole buffer once: 2 (N - 1) times in all.
    assert_eq!(all_bytes, (2 * (N - 1) * LEN * 4) as u64);
}

//! DistributedSampler semantics.
use std::collections::BTreeSet;

use drove_collate::{DistributedSampler, Remainder, SamplerError};

fn shards(len: usize, world: usize, epoch: u64, remainder: Remainder) -> Vec<Vec<usize>> {
    (0..world)
        .map(|r| {
            let mut s = DistributedSampler::new(len, world, r, 42).unwrap().remainder(remainder);
            s.set_epoch(epoch);
            s.indices()
        })
        .collect()
}

#[test]
fn shards_are_disjoint_equal_and_cover_the_dataset() {
    for world in [1, 2, 3, 4, 7] {
        for len in [0, 1, 5, 100, 103] {
            // Drop: disjoint, equal, and nothing but the tail left out.
            let dropped = shards(len, world, 0, Remainder::Drop);
            let all: Vec<usize> = dropped.iter().flatten().copied().collect();
            let set: BTreeSet<usize> = all.iter().copied().collect();
            assert_eq!(set.len(), all.len(), "world {world} len {len}: overlap");
            assert_eq!(all.len(), len / world * world);
            assert!(dropped.iter().all(|s| s.len() == len / world));
            // Pad: equal shards that cover every sample; only padding repeats.
            let padded = shards(len, world, 0, Remainder::Pad);
            let all: Vec<usize> = padded.iter().flatten().copied().collect();
            let set: BTreeSet<usize> = all.iter().copied().collect();
            assert_eq!(set, (0..len).collect(), "world {world} len {len}: not covered");
            assert_eq!(all.len(), len.div_ceil(world) * world);
            assert!(padded.iter().all(|s| s.len() == len.div_ceil(world)));
        }
    }
}

#[test]
fn order_agrees_on_all_ranks_and_changes_with_the_epoch() {
    let orders: Vec<Vec<usize>> = (0..4)
        .map(|r| {
            let mut s = DistributedSampler::new(1000, 4, r, 42).unwrap();
            s.set_epoch(3);
            s.global_order()
        })
        .collect();
    assert!(orders.iter().all(|o| o == &orders[0]), "ranks disagree on the order");
    let e0 = shards(1000, 4, 0, Remainder::Pad);
    let e1 = shards(1000, 4, 1, Remainder::Pad);
    assert_ne!(e0, e1);
    assert_eq!(e0, shards(1000, 4, 0, Remainder::Pad), "same epoch, same order");
    assert_ne!(e0[0], (0..250).map(|i| i * 4).collect::<Vec<_>>(), "shuffled");
    // Strided: rank r holds positions r, r+W, ... of the global order.
    let global = DistributedSampler::new(1000, 4, 0, 42).unwrap().global_order();
    assert_eq!(e0[2], global.iter().skip(2).step_by(4).copied().collect::<Vec<_>>());
    // Without shuffling the order is the identity.
    let plain = DistributedSampler::new(10, 2, 1, 42).unwrap().shuffle(false).indices();
    assert_eq!(plain, [1, 3, 5, 7, 9]);
}

#[test]
fn a_rank_outside_the_world_is_refused() {
    assert_eq!(
        DistributedSampler::new(10, 4, 4, 0).unwrap_err(),
        SamplerError::RankOutOfRange { rank: 4, world_size: 4 }
    );
    assert_eq!(DistributedSampler::new(10, 0, 0, 0).unwrap_err(), SamplerError::EmptyWorld);
    let msg = DistributedSampler::new(10, 2, 5, 0).unwrap_err().to_string();
    assert!(msg.contains("rank 5") && msg.contains("world size 2"), "{msg}");
}

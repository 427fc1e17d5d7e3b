//! DistributedSampler semantics.
use std::collections::BTreeSet;

use drove_collate::{DistributedSampler, Remainder, SamplerError, SamplerOptions};

fn shards(len: usize, world: usize, epoch: u64, remainder: Remainder) -> Vec<Vec<usize>> {
    (0..world)
        .map(|r| {
            let mut s = DistributedSampler::new(
                len,
                SamplerOptions {
                    world_size: world,
                    rank: r,
                    seed: 42,
                    remainder,
                    ..SamplerOptions::default()
                },
            )
            .unwrap();
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
            let mut s = DistributedSampler::new(
                1000,
                SamplerOptions { world_size: 4, rank: r, seed: 42, ..SamplerOptions::default() },
            )
            .unwrap();
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
    let global = DistributedSampler::new(
        1000,
        SamplerOptions { world_size: 4, rank: 0, seed: 42, ..SamplerOptions::default() },
    )
    .unwrap()
    .global_order();
    assert_eq!(e0[2], global.iter().skip(2).step_by(4).copied().collect::<Vec<_>>());
    // Without shuffling the order is the identity.
    let plain = DistributedSampler::new(
        10,
        SamplerOptions { world_size: 2, rank: 1, seed: 42, shuffle: false, ..SamplerOptions::default() },
    )
    .unwrap()
    .indices();
    assert_eq!(plain, [1, 3, 5, 7, 9]);
}

#[test]
fn a_rank_outside_the_world_is_refused() {
    assert_eq!(
        DistributedSampler::new(
            10,
            SamplerOptions { world_size: 4, rank: 4, seed: 0, ..SamplerOptions::default() }
        )
        .unwrap_err(),
        SamplerError::RankOutOfRange { rank: 4, world_size: 4 }
    );
    assert_eq!(
        DistributedSampler::new(
            10,
            SamplerOptions { world_size: 0, rank: 0, seed: 0, ..SamplerOptions::default() }
        )
        .unwrap_err(),
        SamplerError::EmptyWorld
    );
    let msg = DistributedSampler::new(
        10,
        SamplerOptions { world_size: 2, rank: 5, seed: 0, ..SamplerOptions::default() },
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("rank 5") && msg.contains("world size 2"), "{msg}");
}

/// Batch `k` of every rank of a world of `world` with batches of `batch`,
/// from `start`: the positions of the epoch's order they take together.
fn step_positions(len: usize, world: usize, batch: usize, start: usize, k: usize) -> Vec<usize> {
    let order = DistributedSampler::new(len, SamplerOptions { seed: 42, ..SamplerOptions::default() })
        .unwrap()
        .epoch_order();
    let mut taken: Vec<usize> = (0..world)
        .flat_map(|r| {
            let s = DistributedSampler::new(
                len,
                SamplerOptions { world_size: world, rank: r, seed: 42, ..SamplerOptions::default() },
            )
            .unwrap()
            .starting_at(start);
            s.indices().into_iter().skip(k * batch).take(batch).collect::<Vec<_>>()
        })
        .map(|sample| order.iter().position(|&o| o == sample).unwrap())
        .collect();
    taken.sort_unstable();
    taken.dedup();
    taken
}

#[test]
fn a_world_resharded_mid_epoch_applies_every_position_once() {
    // 4 ranks x 3 rows for 2 steps (positions 0..24), then the rest at world 3:
    // every position of the epoch exactly once, each step a contiguous block.
    let (len, batch) = (101, 3);
    let mut applied: Vec<usize> = (0..2).flat_map(|k| step_positions(len, 4, batch, 0, k)).collect();
    assert_eq!(applied, (0..24).collect::<Vec<_>>());
    let rest = DistributedSampler::new(
        len,
        SamplerOptions { world_size: 3, rank: 0, seed: 42, ..SamplerOptions::default() },
    )
    .unwrap()
    .starting_at(24);
    assert_eq!((rest.start(), rest.remaining(), rest.shard_len()), (24, 77, 26));
    for k in 0..rest.shard_len().div_ceil(batch) {
        let from = 24 + k * 3 * batch;
        let to = (from + 3 * batch).min(len);
        // The last step's padding repeats the rest's first positions.
        let (block, padding): (Vec<usize>, Vec<usize>) =
            step_positions(len, 3, batch, 24, k).into_iter().partition(|&p| p >= from);
        assert_eq!(block, (from..to).collect::<Vec<_>>(), "step {k} at world 3");
        assert!(padding.iter().all(|&p| (24..24 + 3 * batch).contains(&p)), "step {k}: {padding:?}");
        applied.extend(block);
    }
    assert_eq!(applied, (0..len).collect::<Vec<_>>());
}

#[test]
fn starting_at_zero_is_the_plain_sampler_and_past_the_end_is_empty() {
    for world in [1, 3, 4] {
        for r in 0..world {
            let plain = DistributedSampler::new(
                50,
                SamplerOptions { world_size: world, rank: r, seed: 7, ..SamplerOptions::default() },
            )
            .unwrap();
            assert_eq!(plain.clone().starting_at(0).indices(), plain.indices());
            assert!(plain.starting_at(80).indices().is_empty());
        }
    }
}

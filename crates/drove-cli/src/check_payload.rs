//! `drove check --size`: tensors whose all-reduced values have a closed form,
//! so a cluster's data path can be checked element by element, at the sizes
//! a gradient all-reduce sends, whatever carries it (shared memory, the TCP
//! ring, the hierarchical all-reduce).
//!
//! Each rank all-reduces (sum) one `i64` and one `f32` tensor of the given
//! size, built from its rank and the element's index. The integers must come
//! back exact. The floats are not exactly representable, so the order of the
//! additions shows: each must lie within `(n - 1) * eps * sum(|x_r|)` of the
//! exact sum of the `n` ranks' inputs (eps: f32's machine epsilon), the
//! bound of any order of `n - 1` additions. Digests of both results let runs
//! be compared: every rank of a run must print the same ones, and the
//! integers' digest must be the same whatever the transport.

use drove_collective::{Collective, Element, ReduceOptions};

/// Rank `rank`'s integer at element `i`.
fn int_at(rank: usize, i: usize) -> i64 {
    (rank as i64 + 1) * (i % 10_007) as i64 + i as i64
}

/// The floats repeat with this period.
const FLOAT_PERIOD: usize = 1000;

/// Rank `rank`'s float at element `i`.
fn float_at(rank: usize, i: usize) -> f32 {
    ((i % FLOAT_PERIOD) as f32 + 0.5) * 1e-3 * (rank + 1) as f32 + 0.1
}

/// FNV-1a (64 bits) of `bytes`, as hex.
fn digest(bytes: impl Iterator<Item = u8>) -> String {
    let hash = bytes.fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{hash:016x}")
}

/// What one checked all-reduce gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Checked {
    /// The largest float error, in units of `eps * sum(|x_r|)` (at most `n - 1`).
    pub float_error_eps: f64,
    /// Digest of the summed integers.
    pub int_digest: String,
    /// Digest of the summed floats.
    pub float_digest: String,
}

/// One rank's tensors of `bytes` bytes each.
pub struct Payload {
    rank: usize,
    ints: Vec<i64>,
    floats: Vec<f32>,
}

impl Payload {
    /// Rank `rank`'s tensors.
    pub fn new(rank: usize, bytes: usize) -> Payload {
        let ints = (0..bytes / 8).map(|i| int_at(rank, i)).collect();
        let floats = (0..bytes / 4).map(|i| float_at(rank, i)).collect();
        Payload { rank, ints, floats }
    }

    /// Sums both tensors across `comm`'s ranks, then checks every element.
    pub fn all_reduce_and_check(mut self, comm: &dyn Collective) -> anyhow::Result<Checked> {
        let world = comm.world_size();
        let (ni, nf) = (self.ints.len(), self.floats.len());
        comm.all_reduce("drove.check.i64", &[ni], i64::tensor_mut(&mut self.ints), ReduceOptions::sum())?;
        comm.all_reduce("drove.check.f32", &[nf], f32::tensor_mut(&mut self.floats), ReduceOptions::sum())?;
        self.check(world)
    }

    fn check(&self, world: usize) -> anyhow::Result<Checked> {
        let rank = self.rank;
        let triangle = (world * (world + 1) / 2) as i64;
        for (i, &got) in self.ints.iter().enumerate() {
            let want = triangle * (i % 10_007) as i64 + world as i64 * i as i64;
            anyhow::ensure!(got == want, "rank {rank}: integer element {i} is {got}, expected {want}");
        }
        // The inputs repeat every `FLOAT_PERIOD` elements: their exact sums too.
        let exact: Vec<(f64, f64)> = (0..FLOAT_PERIOD)
            .map(|i| {
                (0..world)
                    .map(|r| f64::from(float_at(r, i)))
                    .fold((0.0, 0.0), |(s, m), x| (s + x, m + x.abs()))
            })
            .collect();
        let mut worst = 0f64;
        for (i, &got) in self.floats.iter().enumerate() {
            let (want, magnitude) = exact[i % FLOAT_PERIOD];
            let error = (f64::from(got) - want).abs() / (f64::from(f32::EPSILON) * magnitude);
            anyhow::ensure!(
                error <= (world - 1) as f64,
                "rank {rank}: float element {i} is {got}, {error:.2} eps off the exact sum {want} \
                 (the bound for {world} ranks is {})",
                world - 1
            );
            worst = worst.max(error);
        }
        Ok(Checked {
            float_error_eps: worst,
            int_digest: digest(self.ints.iter().flat_map(|x| x.to_le_bytes())),
            float_digest: digest(self.floats.iter().flat_map(|x| x.to_le_bytes())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_is_its_own_sum() {
        let checked = Payload::new(0, 4096).check(1).unwrap();
        assert_eq!(checked.float_error_eps, 0.0);
    }

    #[test]
    fn a_wrong_element_is_named() {
        let mut p = Payload::new(0, 64);
        p.ints[3] += 1;
        let e = p.check(1).unwrap_err().to_string();
        assert!(e.contains("integer element 3"), "{e}");
        let mut p = Payload::new(0, 64);
        p.floats[5] *= 1.001;
        let e = p.check(1).unwrap_err().to_string();
        assert!(e.contains("float element 5"), "{e}");
    }

    #[test]
    fn the_sum_of_two_ranks_in_either_order_is_within_the_bound() {
        let (a, b) = (Payload::new(0, 4000), Payload::new(1, 4000));
        let mut sum = Payload::new(0, 4000);
        for i in 0..sum.floats.len() {
            sum.floats[i] = b.floats[i] + a.floats[i];
        }
        for i in 0..sum.ints.len() {
            sum.ints[i] = a.ints[i] + b.ints[i];
        }
        let checked = sum.check(2).unwrap();
        assert!(checked.float_error_eps <= 1.0, "{checked:?}");
    }
}

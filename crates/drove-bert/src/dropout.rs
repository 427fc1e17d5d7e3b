//! Dropout with masks drawn on the host from a small, explicitly seeded stream.
//!
//! burn's `Dropout` samples a Bernoulli tensor through its generic distribution
//! sampler, which costs about 25 ns an element on the CPU backend (an eighth of a
//! MiniLM training step). Here the keep-mask comes from a SplitMix64 stream, a
//! nanosecond an element, already scaled by `1 / keep` so it is one multiply.
//! The stream is per thread and set with [`seed_dropout`], so a trainer makes
//! dropout a function of (seed, rank, step) and a resumed run repeats it.
//!
//! Each row of a dropped tensor (its first dimension, the batch row) draws from
//! its own stream, keyed by the seed, the call's place in the forward pass and
//! the row's index in the whole batch. A trainer that splits a batch into
//! micro-batches on several threads calls [`seed_dropout_rows`] with each one's
//! first row, and gets exactly the masks of the unsplit batch.

use std::cell::Cell;

use burn::nn::Dropout;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// This thread's dropout stream: seed, first batch row, calls made since seeding.
#[derive(Clone, Copy)]
struct Stream {
    seed: u64,
    first_row: u64,
    calls: u64,
}

thread_local! {
    static STATE: Cell<Stream> = const { Cell::new(Stream { seed: 0x9E37_79B9_7F4A_7C15, first_row: 0, calls: 0 }) };
}

/// Restarts this thread's dropout stream at `seed`, for a forward pass over a
/// whole batch.
pub fn seed_dropout(seed: u64) {
    seed_dropout_rows(seed, 0);
}

/// Restarts this thread's dropout stream at `seed`, for a forward pass over
/// the rows of a batch from `first_row` on (a micro-batch).
pub fn seed_dropout_rows(seed: u64, first_row: usize) {
    STATE.with(|s| s.set(Stream { seed, first_row: first_row as u64, calls: 0 }));
}

#[inline]
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Applies `dropout` to `x` when gradients are being tracked (training), as
/// burn's `Dropout::forward` does, with a mask from this thread's stream.
pub fn dropout<B: Backend, const D: usize>(dropout: &Dropout, x: Tensor<B, D>) -> Tensor<B, D> {
    let device = x.device();
    if dropout.prob <= 0.0 || !B::ad_enabled(&device) {
        return x;
    }
    let keep = 1.0 - dropout.prob;
    let shape = x.shape();
    let n = shape.num_elements();
    let rows = shape.dims::<D>().first().copied().unwrap_or(1).max(1);
    let per_row = n / rows;
    let threshold = (keep * 4_294_967_296.0) as u64;
    let scale = (1.0 / keep) as f32;
    let mut mask = Vec::with_capacity(n);
    let stream = STATE.with(|cell| {
        let s = cell.get();
        cell.set(Stream { calls: s.calls + 1, ..s });
        s
    });
    for row in 0..rows as u64 {
        // A row's stream: the seed moved by (call, row), scrambled once.
        let mut state = stream.seed
            ^ stream.calls.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03)
            ^ (stream.first_row + row).wrapping_add(1).wrapping_mul(0x8CB9_2BA7_2F3D_8DD7);
        state = splitmix(&mut state);
        let mut i = 0;
        while i < per_row {
            let r = splitmix(&mut state);
            for half in [r & 0xffff_ffff, r >> 32] {
                if i < per_row {
                    mask.push(if half < threshold { scale } else { 0.0 });
                    i += 1;
                }
            }
        }
    }
    let mask = Tensor::<B, D>::from_data(TensorData::new(mask, shape), &device);
    x * mask
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use burn::nn::DropoutConfig;

    use super::*;

    fn masked(seed: u64) -> Vec<f32> {
        seed_dropout(seed);
        let x = Tensor::<Autodiff<Flex>, 2>::ones([100, 1000], &Default::default());
        dropout(&DropoutConfig::new(0.1).init(), x).into_data().to_vec::<f32>().unwrap()
    }

    #[test]
    fn keeps_the_right_fraction_scaled_and_repeats_with_its_seed() {
        let a = masked(7);
        let kept = a.iter().filter(|&&v| v != 0.0).count() as f64 / a.len() as f64;
        // 100,000 Bernoulli(0.9) draws: sigma 0.00095.
        assert!((kept - 0.9).abs() < 0.004, "kept {kept}");
        assert!(a.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.9).abs() < 1e-6));
        assert_eq!(a, masked(7));
        assert_ne!(a, masked(8));
    }

    #[test]
    fn a_split_batch_gets_the_masks_of_the_whole_one() {
        let layer = DropoutConfig::new(0.1).init();
        let run = |first_row: usize, rows: usize| -> Vec<f32> {
            seed_dropout_rows(7, first_row);
            let x = Tensor::<Autodiff<Flex>, 3>::ones([rows, 10, 30], &Default::default());
            // Two calls, as two layers of a forward pass make.
            let once = dropout(&layer, x);
            dropout(&layer, once).into_data().to_vec::<f32>().unwrap()
        };
        let whole = run(0, 10);
        let mut halves = run(0, 4);
        halves.extend(run(4, 6));
        assert_eq!(whole, halves);
        assert_ne!(run(0, 4), run(4, 4), "rows draw from their own streams");
    }

    #[test]
    fn is_the_identity_without_autodiff() {
        let x = Tensor::<Flex, 1>::ones([10], &Default::default());
        let y = dropout(&DropoutConfig::new(0.5).init(), x);
        assert_eq!(y.into_data().to_vec::<f32>().unwrap(), vec![1.0; 10]);
    }
}

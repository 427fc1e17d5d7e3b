//! Dropout with masks drawn on the host from a small, explicitly seeded stream.
//!
//! burn's `Dropout` samples a Bernoulli tensor through its generic distribution
//! sampler, which costs about 25 ns an element on the CPU backend (an eighth of a
//! MiniLM training step). Here the keep-mask comes from a SplitMix64 stream, a
//! nanosecond an element, already scaled by `1 / keep` so it is one multiply.
//! The stream is per thread and set with [`seed_dropout`], so a trainer makes
//! dropout a function of (seed, rank, step) and a resumed run repeats it.

use std::cell::Cell;

use burn::nn::Dropout;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

thread_local! {
    static STATE: Cell<u64> = const { Cell::new(0x9E37_79B9_7F4A_7C15) };
}

/// Restarts this thread's dropout stream at `seed`.
pub fn seed_dropout(seed: u64) {
    STATE.with(|s| s.set(seed));
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
    let threshold = (keep * 4_294_967_296.0) as u64;
    let scale = (1.0 / keep) as f32;
    let mut mask = Vec::with_capacity(n);
    STATE.with(|cell| {
        let mut state = cell.get();
        let mut i = 0;
        while i < n {
            let r = splitmix(&mut state);
            for half in [r & 0xffff_ffff, r >> 32] {
                if i < n {
                    mask.push(if half < threshold { scale } else { 0.0 });
                    i += 1;
                }
            }
        }
        cell.set(state);
    });
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
    fn is_the_identity_without_autodiff() {
        let x = Tensor::<Flex, 1>::ones([10], &Default::default());
        let y = dropout(&DropoutConfig::new(0.5).init(), x);
        assert_eq!(y.into_data().to_vec::<f32>().unwrap(), vec![1.0; 10]);
    }
}

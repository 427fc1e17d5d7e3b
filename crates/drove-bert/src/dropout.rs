//! Dropout with masks from a small, explicitly seeded stream, drawn on the
//! device where drove has the kernel and on the host elsewhere.
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
//! the row's index in the whole batch ([`drove_kernels::dropout::Mask`]). A
//! trainer that splits a batch into micro-batches on several threads calls
//! [`seed_dropout_rows`] with each one's first row, and gets exactly the masks
//! of the unsplit batch.
//!
//! On drove's GPU backends (`drove_kernels::backends`) a kernel computes each
//! element's mask value where it is used, the same bits as the host's, and
//! recomputes it for the gradient: no mask is drawn on the host, uploaded or
//! kept alive ([`Masks::Device`], the default). [`set_dropout_masks`] with
//! [`Masks::Host`] draws them on the host for every backend, as the CPU does.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::nn::Dropout;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use drove_kernels::dropout::{Mask, masked};
use drove_kernels::transfer;

/// This thread's dropout stream: seed, first batch row, calls made since seeding.
#[derive(Clone, Copy)]
struct DropoutStream {
    seed: u64,
    first_row: u64,
    calls: u64,
}

thread_local! {
    static STATE: Cell<DropoutStream> = const { Cell::new(DropoutStream { seed: 0x9E37_79B9_7F4A_7C15, first_row: 0, calls: 0 }) };
}

/// Where dropout masks are drawn on a GPU backend; the masks are the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Masks {
    /// By a kernel on the device, recomputed for the gradient (GPU backends
    /// with drove's kernels; every other backend draws on the host).
    #[default]
    Device,
    /// On the host, uploaded, and kept for the gradient (the CPU's path).
    Host,
}

/// Whether masks are drawn on the host on every backend (process-wide).
static HOST_MASKS: AtomicBool = AtomicBool::new(false);

/// Sets where this process draws dropout masks from now on, on every thread.
pub fn set_dropout_masks(masks: Masks) {
    HOST_MASKS.store(masks == Masks::Host, Ordering::Relaxed);
}

/// Where this process draws dropout masks.
pub fn dropout_masks() -> Masks {
    if HOST_MASKS.load(Ordering::Relaxed) { Masks::Host } else { Masks::Device }
}

/// Restarts this thread's dropout stream at `seed`, for a forward pass over a
/// whole batch.
pub fn seed_dropout(seed: u64) {
    seed_dropout_rows(seed, 0);
}

/// Restarts this thread's dropout stream at `seed`, for a forward pass over
/// the rows of a batch from `first_row` on (a micro-batch).
pub fn seed_dropout_rows(seed: u64, first_row: usize) {
    STATE.with(|s| s.set(DropoutStream { seed, first_row: first_row as u64, calls: 0 }));
}

/// The mask of this thread's next dropout call (the call counted).
fn next_mask(keep: f64) -> Mask {
    let stream = STATE.with(|cell| {
        let s = cell.get();
        cell.set(DropoutStream { calls: s.calls + 1, ..s });
        s
    });
    Mask { seed: stream.seed, call: stream.calls, first_row: stream.first_row, keep }
}

/// Applies `dropout` to `x` when gradients are being tracked (training), as
/// burn's `Dropout::forward` does, with a mask from this thread's stream.
pub fn dropout<B: Backend, const D: usize>(dropout: &Dropout, x: Tensor<B, D>) -> Tensor<B, D> {
    let device = x.device();
    if dropout.prob <= 0.0 || !B::ad_enabled(&device) {
        return x;
    }
    let mask = next_mask(1.0 - dropout.prob);
    let x = match dropout_masks() {
        Masks::Device => match masked(x, mask) {
            Ok(dropped) => return dropped,
            Err(x) => x,
        },
        Masks::Host => x,
    };
    let shape = x.shape();
    let (rows, per_row) = Mask::rows_of(&shape);
    let values: Tensor<B, D> =
        transfer::upload(TensorData::new(mask.host_values(rows, per_row), shape), &device);
    x * values
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

//! The diagnostic on two simulated ranks: one pair drawing independent masks,
//! one pair drawing the same masks (the bug), and their gradients' cosine.
//!
//!     cargo run -p drove-diagnostic --example two_ranks

use drove_diagnostic::{AgreementAccumulator, GradCosine, RowMasks};

/// A deterministic mask of `width` positions at about probability 0.15.
fn mask(width: usize, stream: u64) -> RowMasks {
    let mut state = stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let chosen = (0..width)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % 100 < 15
        })
        .collect();
    RowMasks { width, chosen, maskable: vec![true; width] }
}

fn main() {
    let (mut independent, mut shared) =
        (AgreementAccumulator::new(2, 0.15), AgreementAccumulator::new(2, 0.15));
    for step in 0..50u64 {
        independent.add_step(&[mask(128, 2 * step + 1), mask(128, 2 * step + 2)]);
        shared.add_step(&[mask(128, step + 1), mask(128, step + 1)]);
    }
    for (what, run) in [("independent streams", independent), ("one stream for both", shared)] {
        let r = run.report();
        println!(
            "{what}: agreement {:.4} (expected {:.4} +- {:.4}): {}",
            r.mean_agreement,
            r.expected,
            3.0 * r.sigma,
            r.verdict
        );
        println!("  {}", r.explain());
    }
    let grads = [vec![0.5f32, -1.0, 2.0], vec![0.4, -1.1, 2.2]];
    println!("gradient cosine of two ranks: {:.4}", GradCosine::of(&grads).mean);
}

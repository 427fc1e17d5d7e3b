//! The CubeCL kernel: [`Mask`](super::Mask)'s value of each element computed
//! where it is used, times the element.
//!
//! WGSL has no 64-bit integers, so every 64-bit value of SplitMix64 is a pair
//! of 32-bit words `(lo, hi)` and every operation on it is written with
//! 32-bit multiplies, adds, shifts and compares only, the same code on every
//! runtime: the test on lavapipe checks the arithmetic CUDA runs too.

use cubecl::prelude::*;

use super::mask::{GAMMA, MIX, ROW_KEY};

// The 64-bit constants as (low, high) 32-bit words.
const MIX0_LO: u32 = MIX[0] as u32;
const MIX0_HI: u32 = (MIX[0] >> 32) as u32;
const MIX1_LO: u32 = MIX[1] as u32;
const MIX1_HI: u32 = (MIX[1] >> 32) as u32;
const ROW_LO: u32 = ROW_KEY as u32;
const ROW_HI: u32 = (ROW_KEY >> 32) as u32;
const GAMMA_LO: u32 = GAMMA as u32;
const GAMMA_HI: u32 = (GAMMA >> 32) as u32;

/// The high 32 bits of the 64-bit product of `a` and `b`, from 16-bit halves
/// (each partial product fits in 32 bits).
#[cube]
fn mul_hi32(a: u32, b: u32) -> u32 {
    let a0 = a & 0xFFFFu32;
    let a1 = a >> 16u32;
    let b0 = b & 0xFFFFu32;
    let b1 = b >> 16u32;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let middle = (p00 >> 16u32) + (p01 & 0xFFFFu32) + (p10 & 0xFFFFu32);
    p11 + (p01 >> 16u32) + (p10 >> 16u32) + (middle >> 16u32)
}

/// `a * b` modulo 2^64.
#[cube]
fn mul64(a_lo: u32, a_hi: u32, b_lo: u32, b_hi: u32) -> (u32, u32) {
    (a_lo * b_lo, mul_hi32(a_lo, b_lo) + a_lo * b_hi + a_hi * b_lo)
}

/// `a + b` modulo 2^64.
#[cube]
fn add64(a_lo: u32, a_hi: u32, b_lo: u32, b_hi: u32) -> (u32, u32) {
    let low = a_lo + b_lo;
    let carry = select(low < a_lo, 1u32, 0u32);
    (low, a_hi + b_hi + carry)
}

/// SplitMix64's output function (`mask::mix`).
#[cube]
fn mix(z_lo: u32, z_hi: u32) -> (u32, u32) {
    // z ^= z >> 30; z *= MIX[0]
    let l = z_lo ^ ((z_lo >> 30u32) | (z_hi << 2u32));
    let h = z_hi ^ (z_hi >> 30u32);
    let (l, h) = mul64(l, h, MIX0_LO, MIX0_HI);
    // z ^= z >> 27; z *= MIX[1]
    let l2 = l ^ ((l >> 27u32) | (h << 5u32));
    let h2 = h ^ (h >> 27u32);
    let (l, h) = mul64(l2, h2, MIX1_LO, MIX1_HI);
    // z ^ (z >> 31)
    (l ^ ((l >> 31u32) | (h << 1u32)), h ^ (h >> 31u32))
}

/// `output = input * mask` over a contiguous tensor of rows of `per_row`
/// elements. The key: `key` is the seed moved by the call
/// (`Mask::call_key`), `row_base` the first row's index in the batch plus
/// one, `threshold` and `scale` the mask's.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn masked<F: Float>(
    input: &Tensor<F>,
    output: &mut Tensor<F>,
    per_row: u32,
    key_lo: u32,
    key_hi: u32,
    row_base_lo: u32,
    row_base_hi: u32,
    threshold_lo: u32,
    threshold_hi: u32,
    scale: InputScalar,
    #[define(F)] _dtype: StorageType,
) {
    if ABSOLUTE_POS >= output.len() {
        terminate!();
    }
    let position = ABSOLUTE_POS as u32;
    let row = position / per_row;
    let i = position % per_row;
    // The row's stream: key ^ (first_row + row + 1) * ROW_KEY, then one mix
    // of itself plus GAMMA (`Mask::row_state`).
    let (r_lo, r_hi) = add64(row_base_lo, row_base_hi, row, 0u32);
    let (t_lo, t_hi) = mul64(r_lo, r_hi, ROW_LO, ROW_HI);
    let (s_lo, s_hi) = add64(key_lo ^ t_lo, key_hi ^ t_hi, GAMMA_LO, GAMMA_HI);
    let (s_lo, s_hi) = mix(s_lo, s_hi);
    // Draw k = i / 2 of that stream: mix(state + (k + 1) * GAMMA).
    let (d_lo, d_hi) = mul64(i / 2u32 + 1u32, 0u32, GAMMA_LO, GAMMA_HI);
    let (u_lo, u_hi) = add64(s_lo, s_hi, d_lo, d_hi);
    let (z_lo, z_hi) = mix(u_lo, u_hi);
    // Even elements take the draw's low half, odd ones its high half.
    let half = select((i & 1u32) == 0u32, z_lo, z_hi);
    let kept = threshold_hi > 0u32 || half < threshold_lo;
    let value = select(kept, scale.get::<F>(), F::new(0.0));
    output[ABSOLUTE_POS] = input[ABSOLUTE_POS] * value;
}

//! The two CubeCL kernels of the table gradient: [`plan`] sorts the batch's
//! tokens by id on the device, [`scatter`] sums each id's run of tokens into
//! its row. No atomics: every slot of the plan and every element of the
//! gradient is written by exactly one thread, and each sum is added in
//! ascending token order, so two runs give the same bits.
//!
//! The sort is by counting, without a read to the host (burn 0.21's sort on
//! cubecl reads the tensor back and sorts there): token `t`'s place is the
//! number of tokens with a smaller id plus the number of earlier tokens with
//! its id. That is `n` comparisons a token, `n²` in all (1.1e9 for 256
//! sequences of 128 tokens, a fraction of a millisecond on a datacenter GPU;
//! 4e6 for 32 of 64), against the `n` read-modify-writes a column of burn's
//! `select_assign`, which run one after another on 384 threads.

use cubecl::prelude::*;

/// Token `t`'s place in the batch sorted by (id, token): `order[place] = t`,
/// and `head[place]` the number of tokens with `t`'s id when `t` is the
/// first of them (its run starts there), 0 otherwise. Every place is written
/// by one token, so neither output needs to be cleared first.
#[cube(launch_unchecked)]
pub(crate) fn plan<I: Int>(
    ids: &Tensor<I>,
    order: &mut Tensor<u32>,
    head: &mut Tensor<u32>,
    #[define(I)] _dtype: StorageType,
) {
    let n = ids.len();
    if ABSOLUTE_POS >= n {
        terminate!();
    }
    let t = ABSOLUTE_POS;
    let id = ids[t];
    let mut smaller = 0u32;
    let mut before = 0u32;
    let mut after = 0u32;
    for u in 0..t {
        let other = ids[u];
        smaller += select(other < id, 1u32, 0u32);
        before += select(other == id, 1u32, 0u32);
    }
    for u in t..n {
        let other = ids[u];
        smaller += select(other < id, 1u32, 0u32);
        after += select(other == id, 1u32, 0u32);
    }
    let place = (smaller + before) as usize;
    order[place] = t as u32;
    head[place] = select(before == 0u32, before + after, 0u32);
}

/// `output[id, c]` = the sum of `grad[t, c]` over the tokens `t` of each
/// run of [`plan`], in ascending token order from 0.0, one thread a (place,
/// column): threads at a place where no run starts, and runs whose id is
/// not a row of `output` (below 0 or from `vocab` on, which burn's lookup
/// does not define), write nothing. `output` comes zeroed. `grad` is
/// `[n, hidden]` and `output` `[vocab, hidden]`, both contiguous.
///
/// The run is read four tokens at a time so that four loads are in flight
/// (a long run, such as the padding's, is otherwise one load after another),
/// and added one by one in order.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter<F: Float, I: Int>(
    grad: &Tensor<F>,
    ids: &Tensor<I>,
    order: &Tensor<u32>,
    head: &Tensor<u32>,
    output: &mut Tensor<F>,
    hidden: u32,
    vocab: u32,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let width = hidden as usize;
    if ABSOLUTE_POS >= grad.len() {
        terminate!();
    }
    let place = ABSOLUTE_POS / width;
    let c = ABSOLUTE_POS % width;
    let length = head[place] as usize;
    if length == 0 {
        terminate!();
    }
    // A negative id casts to a large u32, which is not a row either.
    let row = u32::cast_from(ids[order[place] as usize]);
    if row >= vocab {
        terminate!();
    }
    let mut sum = F::new(0.0);
    let quads = length / 4;
    for q in 0..quads {
        let j = place + q * 4;
        let a = grad[order[j] as usize * width + c];
        let b = grad[order[j + 1] as usize * width + c];
        let d = grad[order[j + 2] as usize * width + c];
        let e = grad[order[j + 3] as usize * width + c];
        sum += a;
        sum += b;
        sum += d;
        sum += e;
    }
    for j in place + quads * 4..place + length {
        sum += grad[order[j] as usize * width + c];
    }
    output[row as usize * width + c] = sum;
}

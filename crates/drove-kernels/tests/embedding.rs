//! drove's embedding lookup on a wgpu adapter (lavapipe here), through burn's
//! unfused and fused wgpu backends (the CUDA build is fused), under
//! autodiff: the rows are burn's `embedding`'s bit for bit; the table's
//! gradient is burn's within 1e-6 of its largest magnitude, and is bit for
//! bit the host's sum of each id's tokens in ascending order, on every run,
//! with gradients whose sum changes when its order does. On the CPU the
//! call comes back for burn's lookup.
#![cfg(feature = "wgpu")]

mod common;

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::module::embedding;
use burn::tensor::{Int, Tensor, TensorData};
use drove_kernels::backends::{Wgpu, WgpuFused};
use drove_kernels::embedding::lookup;

use common::{bits, device_or_skip, values};

/// A lookup: the table's size and the batch's ids.
struct Case {
    what: &'static str,
    vocab: usize,
    hidden: usize,
    shape: [usize; 2],
    ids: Vec<i64>,
}

/// Ids from a 32-bit LCG in `0..vocab`.
fn drawn(n: usize, vocab: usize, seed: u32) -> Vec<i64> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            i64::from(state >> 8) % vocab as i64
        })
        .collect()
}

/// The shapes: padding (id 0) filling the end of most sequences, runs long
/// and short (the kernel reads four tokens at a time, then the rest), ids at
/// both edges of the table, batch 1 with an odd length, odd widths.
fn cases() -> Vec<Case> {
    let padded = |batch: usize, seq: usize, vocab: usize, hidden: usize| {
        let mut ids = drawn(batch * seq, vocab, 7);
        for (i, id) in ids.iter_mut().enumerate() {
            let (row, position) = (i / seq, i % seq);
            if position > 0 && position >= seq * (batch - row) / (batch + 1) {
                *id = 0;
            }
        }
        Case { what: "padded", vocab, hidden, shape: [batch, seq], ids }
    };
    vec![
        padded(4, 13, 30, 8),
        padded(3, 32, 1000, 33),
        Case {
            what: "table edges",
            vocab: 37,
            hidden: 5,
            shape: [2, 5],
            ids: vec![36, 0, 36, 1, 35, 0, 36, 0, 0, 36],
        },
        Case {
            what: "batch 1, odd length",
            vocab: 11,
            hidden: 7,
            shape: [1, 7],
            ids: vec![3, 10, 3, 3, 0, 10, 3],
        },
        Case { what: "one id", vocab: 4, hidden: 3, shape: [2, 9], ids: vec![2; 18] },
        Case {
            what: "no repeats",
            vocab: 16,
            hidden: 4,
            shape: [1, 9],
            ids: vec![15, 2, 0, 9, 4, 11, 7, 1, 13],
        },
    ]
}

/// The table: distinct values of either sign.
fn table(case: &Case) -> Vec<f32> {
    (0..case.vocab * case.hidden).map(|i| (i as f32 * 0.61).sin() * 2.0 - 0.3).collect()
}

/// The gradient that reaches the lookup's output: values from 1e-3 to 1e3
/// of either sign, so that a sum of them in another order (or without one
/// of them) gives other bits.
fn upstream(case: &Case) -> Vec<f32> {
    let n = case.ids.len() * case.hidden;
    (0..n).map(|i| (i as f32 * 1.37).sin() * [1e3f32, 1.0, 1e-3][i % 3] + 0.01).collect()
}

/// The table's gradient summed on the host: each token's row added into
/// its id's row, tokens in ascending order, from 0.0.
fn host_gradient(case: &Case, upstream: &[f32]) -> Vec<f32> {
    let mut sums = vec![0.0f32; case.vocab * case.hidden];
    for (t, &id) in case.ids.iter().enumerate() {
        for c in 0..case.hidden {
            sums[id as usize * case.hidden + c] += upstream[t * case.hidden + c];
        }
    }
    sums
}

fn ids<B: Backend>(case: &Case, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::from_data(TensorData::new(case.ids.clone(), case.shape), device)
}

/// The rows and the table's gradient of `sum(rows * upstream)`, by drove's
/// lookup (`ours`) or by burn's `embedding`.
fn run<B: Backend>(case: &Case, ours: bool, device: &B::Device) -> (Vec<f32>, Vec<f32>) {
    type A<B> = Autodiff<B>;
    let weight =
        Tensor::<A<B>, 2>::from_data(TensorData::new(table(case), [case.vocab, case.hidden]), device)
            .require_grad();
    let ids = ids::<A<B>>(case, device);
    let rows = if ours {
        lookup(weight.clone(), ids)
            .unwrap_or_else(|_| panic!("{} has drove's kernels", std::any::type_name::<B>()))
    } else {
        embedding(weight.clone(), ids)
    };
    let [batch, seq] = case.shape;
    let up = Tensor::<A<B>, 3>::from_data(TensorData::new(upstream(case), [batch, seq, case.hidden]), device);
    let grads = (rows.clone() * up).sum().backward();
    let grad = weight.grad(&grads).expect("the table has a gradient");
    (values(rows.inner()), values(grad))
}

/// The largest difference over the largest magnitude of `reference`.
fn relative_diff(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn matches_burn<B: Backend>(device: &B::Device) {
    for case in cases() {
        let (rows, grad) = run::<B>(&case, true, device);
        let (burn_rows, burn_grad) = run::<B>(&case, false, device);
        assert_eq!(bits(&rows), bits(&burn_rows), "{}: the rows", case.what);
        let diff = relative_diff(&grad, &burn_grad);
        assert!(diff <= 1e-6, "{}: the gradient is {diff:e} off burn's", case.what);
    }
}

#[test]
fn the_unfused_lookup_is_burns() {
    let Some(device) = device_or_skip() else { return };
    matches_burn::<Wgpu>(&device);
}

#[test]
fn the_fused_lookup_is_burns() {
    let Some(device) = device_or_skip() else { return };
    matches_burn::<WgpuFused>(&device);
}

/// Bit for bit the host's ascending sums, twice.
fn sums_in_token_order<B: Backend>(device: &B::Device) {
    for case in cases() {
        let want = host_gradient(&case, &upstream(&case));
        let (_, first) = run::<B>(&case, true, device);
        let (_, second) = run::<B>(&case, true, device);
        assert_eq!(bits(&first), bits(&want), "{}: device {first:?}, host {want:?}", case.what);
        assert_eq!(bits(&second), bits(&first), "{}: a second run", case.what);
    }
}

#[test]
fn the_unfused_gradient_sums_in_token_order_every_run() {
    let Some(device) = device_or_skip() else { return };
    sums_in_token_order::<Wgpu>(&device);
}

#[test]
fn the_fused_gradient_sums_in_token_order_every_run() {
    let Some(device) = device_or_skip() else { return };
    sums_in_token_order::<WgpuFused>(&device);
}

/// The upstream values are chosen so that the order of a sum shows in its
/// bits: reversing a run's order changes some row (else the test above
/// could not see a kernel that sums out of order).
#[test]
fn the_upstream_gradient_tells_orders_apart() {
    for case in cases().iter().filter(|case| case.what != "no repeats") {
        let up = upstream(case);
        let forward = host_gradient(case, &up);
        let reversed = host_gradient(&Case { ids: case.ids.iter().rev().copied().collect(), ..*case }, &{
            let mut rows: Vec<&[f32]> = up.chunks(case.hidden).collect();
            rows.reverse();
            rows.concat()
        });
        assert_ne!(bits(&forward), bits(&reversed), "{}", case.what);
    }
}

#[test]
fn the_cpu_hands_the_lookup_back() {
    let device = Default::default();
    let case = &cases()[0];
    let weight =
        Tensor::<Flex, 2>::from_data(TensorData::new(table(case), [case.vocab, case.hidden]), &device);
    let (weight, ids) = lookup(weight, ids::<Flex>(case, &device)).expect_err("Flex has no kernels");
    assert_eq!(weight.dims(), [case.vocab, case.hidden]);
    assert_eq!(ids.into_data().convert::<i64>().into_vec::<i64>().unwrap(), case.ids);
    let tracked = Tensor::<Autodiff<Flex>, 2>::zeros([3, 2], &device);
    assert!(lookup(tracked, Tensor::<Autodiff<Flex>, 2, Int>::zeros([1, 2], &device)).is_err());
}

//! Gradient averaging is exact: 2 ranks x batch 8 reach the same parameters
//! after 5 AdamW steps as 1 rank x batch 16 over the same 16 sentences, on a
//! small token classifier (`support::Tagger`), and the averaged gradients have
//! the single rank's norm at every step (AdamW divides a uniform scale out of
//! the update, so the parameters alone would not see a sum in place of an
//! average).
//! The ranks here are threads with their own communicators (over shared memory or
//! TCP); the multi-process version runs under `drove run` with the trainer.
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Int, Tensor, TensorData};
use drove_collective::fusion::FusionOptions;
use drove_collective::{Collective, LocalWorld, SingleProcess};
use drove_train::{all_reduce_gradients, broadcast_parameters};
use support::{LABELS, Tagger, tagger};

use crate::support;

type B = Autodiff<Flex>;
const SEQ: usize = 12;

fn data() -> (Vec<i64>, Vec<i64>) {
    let mut s = 12345u64;
    let mut next = |m: u64| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 33) % m) as i64
    };
    let ids = (0..16 * SEQ).map(|_| 1 + next(49)).collect();
    let labels = (0..16 * SEQ).map(|_| next(LABELS as u64)).collect();
    (ids, labels)
}

fn params(model: &Tagger<B>) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            self.0.extend(p.val().into_data().to_vec::<f32>().unwrap());
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// The global norm of `grads`, the gradients of `model`'s parameters.
fn grad_norm(model: &Tagger<B>, grads: &GradientsParams) -> f64 {
    struct Norm<'a>(&'a GradientsParams, f64);
    impl ModuleVisitor<B> for Norm<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            if let Some(g) = self.0.get::<Flex, D>(p.id) {
                self.1 +=
                    g.into_data().to_vec::<f32>().unwrap().iter().map(|&x| f64::from(x).powi(2)).sum::<f64>();
            }
        }
    }
    let mut n = Norm(grads, 0.0);
    model.visit(&mut n);
    n.1.sqrt()
}

/// Five AdamW steps on sentences `rows` (each rank its own), averaging
/// gradients; returns the model and each step's averaged gradients' norm.
fn train<C: Collective>(
    mut model: Tagger<B>,
    comm: &C,
    rows: std::ops::Range<usize>,
) -> (Tagger<B>, Vec<f64>) {
    let device = Default::default();
    model = broadcast_parameters(model, comm, 0, &device).unwrap();
    let (ids, labels) = data();
    let n = rows.len();
    let ids = Tensor::<B, 2, Int>::from_data(
        TensorData::new(ids[rows.start * SEQ..rows.end * SEQ].to_vec(), [n, SEQ]),
        &device,
    );
    let targets = Tensor::<B, 1, Int>::from_data(
        TensorData::new(labels[rows.start * SEQ..rows.end * SEQ].to_vec(), [n * SEQ]),
        &device,
    );
    let mut optim = AdamWConfig::new().with_weight_decay(0.01).init::<B, Tagger<B>>();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut norms = Vec::new();
    for _ in 0..5 {
        let logits = model.forward(ids.clone());
        let loss = loss_fn.forward(logits.reshape([n * SEQ, LABELS]), targets.clone());
        let mut grads = GradientsParams::from_grads(loss.backward(), &model);
        all_reduce_gradients(&model, &mut grads, comm, FusionOptions::default(), &device).unwrap();
        norms.push(grad_norm(&model, &grads));
        model = optim.step(1e-3, model, grads);
    }
    (model, norms)
}

fn relative_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().map(|x| x.abs()).fold(0f32, f32::max).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

#[test]
fn two_ranks_of_batch_8_equal_one_rank_of_batch_16() {
    let device = Default::default();
    let initial = tagger::<B>(&device);
    let before = params(&initial);
    let (single, single_norms) = train(initial.clone(), &SingleProcess, 0..16);
    let single = params(&single);
    assert_eq!(relative_diff(&before, &params(&initial)), 0.0, "training a clone left the original alone");

    let ranks: Vec<_> = LocalWorld::new(2)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            // Rank 1 starts from other random weights: the broadcast must fix that.
            let model = if rank == 0 { initial.clone() } else { tagger::<B>(&device) };
            std::thread::spawn(move || {
                let (model, norms) = train(model, &comm, rank * 8..rank * 8 + 8);
                (params(&model), norms)
            })
        })
        .collect();
    let (results, norms): (Vec<Vec<f32>>, Vec<Vec<f64>>) =
        ranks.into_iter().map(|h| h.join().expect("rank thread")).unzip();
    for (rank, norms) in norms.iter().enumerate() {
        for (step, (a, b)) in single_norms.iter().zip(norms).enumerate() {
            let d = (a - b).abs() / a.max(*b);
            assert!(d <= 1e-5, "rank {rank}, step {step}: gradient norm {b} of 2 x 8 against {a} of 1 x 16");
        }
    }
    assert_eq!(relative_diff(&results[0], &results[1]), 0.0, "ranks must hold identical parameters");
    let d = relative_diff(&single, &results[0]);
    assert!(d <= 1e-5, "2 x 8 differs from 1 x 16 by {d} (relative max)");
    // And training moved the parameters at all.
    assert!(relative_diff(&single, &params(&initial)) > 1e-4);
    assert!(single_norms.iter().all(|&n| n > 0.0), "{single_norms:?}");
}

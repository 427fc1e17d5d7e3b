//! [`SumOrder`]'s layouts give the loss and every parameter's gradient of the
//! model's original layout, on the CPU backend, within 1e-6 of each tensor's
//! largest magnitude (they only sum in another order), at shapes where the
//! dense layers' rows really split into chunks and where they cannot split
//! evenly.

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use drove_bert::{BertConfig, BertForTokenClassification, DenseSums, EmbeddingSums, SumOrder, TokenTypes};

use std::sync::Mutex;

type B = Autodiff<Flex>;

/// The largest difference over the largest magnitude of `a`.
fn relative_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = magnitude(a).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

/// A tiny BERT whose position table holds `seq` tokens, its parameters
/// drawn from a fixed seed (under a lock: the backend's generator is the
/// process's), and drawn at once (burn draws them lazily, and a clone of an
/// undrawn parameter would draw its own).
fn model(seq: usize) -> BertForTokenClassification<B> {
    struct Draw;
    impl ModuleVisitor<B> for Draw {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            p.val();
        }
    }
    static SEEDING: Mutex<()> = Mutex::new(());
    let config = BertConfig { max_position_embeddings: seq.max(64), ..BertConfig::tiny(50) };
    let device = Default::default();
    let _seeding = SEEDING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    B::seed(&device, 1);
    let model = config.init_token_classification::<B>(5, &device);
    model.visit(&mut Draw);
    model
}

/// A deterministic batch: ids, the last rows padded from a point on.
struct Batch {
    ids: Vec<i64>,
    mask: Vec<f32>,
    shape: [usize; 2],
}

impl Batch {
    fn new(batch: usize, seq: usize) -> Self {
        let ids = (0..batch * seq).map(|i| ((i * 7919 + 13) % 50) as i64).collect();
        let mask = (0..batch * seq)
            .map(|i| if i / seq == batch - 1 && i % seq >= seq / 2 { 0.0 } else { 1.0 })
            .collect();
        Batch { ids, mask, shape: [batch, seq] }
    }

    fn ids(&self) -> Tensor<B, 2, Int> {
        Tensor::from_data(TensorData::new(self.ids.clone(), self.shape), &Default::default())
    }

    /// Types 0 and 1 alternating by row, as ids.
    fn mixed_types(&self) -> TokenTypes<B> {
        let [batch, seq] = self.shape;
        let types: Vec<i64> = (0..batch * seq).map(|i| ((i / seq) % 2) as i64).collect();
        TokenTypes::Ids(Tensor::from_data(TensorData::new(types, self.shape), &Default::default()))
    }
}

/// Each parameter's gradient, named by its place in the model.
#[derive(Default)]
struct Grads<'a> {
    gradients: Option<&'a <B as burn::tensor::backend::AutodiffBackend>::Gradients>,
    path: Vec<String>,
    found: Vec<(String, Vec<f32>)>,
}

impl ModuleVisitor<B> for Grads<'_> {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
        let grad = p.val().grad(self.gradients.unwrap()).expect("every parameter gets a gradient");
        self.found.push((self.path.join("."), grad.into_data().to_vec::<f32>().unwrap()));
    }
}

/// The loss (a fixed weighting of the logits) and every parameter's gradient
/// of one forward and backward of `model` laid out as `sums`.
fn step(
    model: &BertForTokenClassification<B>,
    sums: SumOrder,
    batch: &Batch,
    types: TokenTypes<B>,
) -> (f32, Vec<(String, Vec<f32>)>) {
    let model = model.clone().with_sum_order(sums);
    let device = Default::default();
    let mask = Tensor::<B, 2>::from_data(TensorData::new(batch.mask.clone(), batch.shape), &device);
    drove_bert::seed_dropout(11);
    let logits = model.forward(batch.ids(), types, mask);
    let [b, s, l] = logits.dims();
    let weights: Vec<f32> = (0..b * s * l).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
    let loss = (logits * Tensor::<B, 3>::from_data(TensorData::new(weights, [b, s, l]), &device)).sum();
    let value = loss.clone().into_data().to_vec::<f32>().unwrap()[0];
    let gradients = loss.backward();
    let mut grads = Grads { gradients: Some(&gradients), ..Grads::default() };
    model.visit(&mut grads);
    (value, grads.found)
}

/// `sums` against the original layout on `batch`: the loss and every
/// gradient within 1e-6 of its largest magnitude, the biases within 2e-6.
///
/// A bias gradient is one sum over all `batch * seq` rows, summed in two
/// stages (batch, then sequence) by [`DenseSums::SplitK`]: at 1024 rows the
/// two orders differ by up to 1.3e-6 (12 seeds, 8 of their 63 bias tensors
/// above 1e-6); weights and tables stay under 7e-7.
fn assert_same_gradients(sums: SumOrder, batch: &Batch, types: impl Fn() -> TokenTypes<B>) {
    let model = model(batch.shape[1]);
    let (loss, grads) = step(&model, SumOrder::default(), batch, types());
    let (loss2, grads2) = step(&model, sums, batch, types());
    assert!(relative_diff(&[loss], &[loss2]) <= 1e-6, "{sums:?}: loss {loss} against {loss2}");
    assert_eq!(grads.len(), 39, "every parameter of a 2-layer BERT with a head");
    let largest = grads.iter().map(|(_, g)| magnitude(g)).fold(0f32, f32::max);
    for ((name, a), (name2, b)) in grads.iter().zip(&grads2) {
        assert_eq!(name, name2);
        if name.ends_with("key.bias") {
            // A key bias moves every score of a query's row by one amount,
            // which softmax cancels: its gradient is zero but for rounding
            // (1e-7 here), so it is held to be zero in both layouts.
            let (m, m2) = (magnitude(a), magnitude(b));
            assert!(m.max(m2) <= 1e-5 * largest, "{sums:?}: {name}'s gradient {m:e}, {m2:e} is not 0");
            continue;
        }
        let diff = relative_diff(a, b);
        let tolerance = if name.ends_with("bias") { 2e-6 } else { 1e-6 };
        assert!(
            diff <= tolerance,
            "{sums:?}: {name}'s gradient differs by {diff:e} of its largest magnitude"
        );
    }
}

fn magnitude(x: &[f32]) -> f32 {
    x.iter().map(|x| x.abs()).fold(0f32, f32::max)
}

fn dense(dense: DenseSums) -> SumOrder {
    SumOrder { dense, ..SumOrder::default() }
}

const SLICED: SumOrder = SumOrder { dense: DenseSums::Plain, embeddings: EmbeddingSums::Sliced };

#[test]
fn split_k_at_its_default_threshold_in_2_chunks() {
    // 8 x 128 = 1024 tokens: 2 chunks of 512 rows.
    assert_eq!(DenseSums::split_k().chunks(1024), 2);
    let batch = Batch::new(8, 128);
    assert_same_gradients(dense(DenseSums::split_k()), &batch, || TokenTypes::Zero);
}

#[test]
fn split_k_in_8_chunks_and_in_a_divisor_of_the_rows() {
    let sums = DenseSums::SplitK { rows_per_chunk: 16 };
    for (batch, seq, chunks) in [(8, 16, 8), (4, 35, 4), (3, 45, 1)] {
        assert_eq!(sums.chunks(batch * seq), chunks);
        assert_same_gradients(dense(sums), &Batch::new(batch, seq), || TokenTypes::Zero);
    }
}

#[test]
fn sliced_embeddings_with_every_type_0() {
    assert_same_gradients(SLICED, &Batch::new(4, 24), || TokenTypes::Zero);
}

#[test]
fn sliced_embeddings_still_look_types_up_when_given_as_ids() {
    let batch = Batch::new(4, 24);
    assert_same_gradients(SLICED, &batch, || batch.mixed_types());
}

#[test]
fn both_at_once() {
    let sums =
        SumOrder { dense: DenseSums::SplitK { rows_per_chunk: 16 }, embeddings: EmbeddingSums::Sliced };
    assert_same_gradients(sums, &Batch::new(4, 32), || TokenTypes::Zero);
}

#[test]
fn the_order_is_no_part_of_the_weights_and_survives_valid() {
    let model = model(64);
    let sums = SumOrder { dense: DenseSums::split_k(), embeddings: EmbeddingSums::Sliced };
    let ordered = model.clone().with_sum_order(sums);
    assert_eq!(ordered.num_params(), model.num_params());
    assert_eq!(ordered.valid().bert.sums, sums, "evaluation (the inner backend) keeps the layout");
}

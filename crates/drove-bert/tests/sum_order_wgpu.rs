//! [`EmbeddingSums::Sliced`] on a wgpu adapter (lavapipe here), through
//! burn's unfused and fused wgpu backends: the word table, looked up through
//! drove's deterministic scatter there, gets the gradient it gets under
//! [`EmbeddingSums::Select`] (burn's lookup), within 1e-6 of its largest
//! magnitude, and so do the position and token-type tables.
#![cfg(feature = "wgpu")]

use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use drove_bert::{BertConfig, EmbeddingSums, Embeddings, TokenTypes};
use drove_kernels::backends::{Wgpu, WgpuFused};

const VOCAB: usize = 50;
const SHAPE: [usize; 2] = [3, 11];

/// Ids with repeats, both edges of the table, and padding (id 0) at the end
/// of the last two sequences.
fn ids() -> Vec<i64> {
    let [batch, seq] = SHAPE;
    (0..batch * seq)
        .map(|i| {
            let (row, position) = (i / seq, i % seq);
            if row > 0 && position >= seq - 3 * row { 0 } else { ((i * 7919 + 13) % VOCAB) as i64 }
        })
        .collect()
}

/// Each table's gradient (word, position, token type) of a fixed weighting
/// of the embeddings' output, summed as `sums`.
fn gradients<B: Backend>(
    embeddings: &Embeddings<Autodiff<B>>,
    sums: EmbeddingSums,
    device: &B::Device,
) -> [Vec<f32>; 3] {
    let ids = Tensor::<Autodiff<B>, 2, Int>::from_data(TensorData::new(ids(), SHAPE), device);
    let out = embeddings.forward(ids, TokenTypes::Zero, sums);
    let [batch, seq, hidden] = out.dims();
    let weights: Vec<f32> = (0..batch * seq * hidden).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
    let grads =
        (out * Tensor::from_data(TensorData::new(weights, [batch, seq, hidden]), device)).sum().backward();
    let read = |table: &burn::nn::Embedding<Autodiff<B>>| {
        let grad = table.weight.val().grad(&grads).expect("every table gets a gradient");
        grad.into_data().convert::<f32>().into_vec::<f32>().unwrap()
    };
    [read(&embeddings.word), read(&embeddings.position), read(&embeddings.token_type)]
}

/// The largest difference over the largest magnitude of `reference`.
fn relative_diff(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn sliced_is_select<B: Backend>(device: &B::Device) {
    let config =
        BertConfig { hidden_dropout_prob: 0.0, attention_probs_dropout_prob: 0.0, ..BertConfig::tiny(VOCAB) };
    let embeddings = config.init_token_classification::<Autodiff<B>>(5, device).bert.embeddings;
    let select = gradients::<B>(&embeddings, EmbeddingSums::Select, device);
    let sliced = gradients::<B>(&embeddings, EmbeddingSums::Sliced, device);
    let name = std::any::type_name::<B>();
    assert!(select[0].iter().any(|&g| g != 0.0), "{name}: the word table has a gradient");
    for ((table, a), b) in ["word", "position", "token type"].iter().zip(&sliced).zip(&select) {
        let diff = relative_diff(a, b);
        assert!(diff <= 1e-6, "{name}: the {table} table's gradient is {diff:e} off Select's");
    }
}

#[test]
fn sliced_embeddings_give_selects_table_gradients_on_wgpu() {
    let Some(device) = drove_kernels::testing::wgpu_device_or_skip() else { return };
    sliced_is_select::<Wgpu>(&device);
    sliced_is_select::<WgpuFused>(&device);
}

//! The model the behaviour tests train: a small token classifier, any burn
//! model would do. Its parameters are named so the default weight-decay rule
//! applies to some and not others (`embedding.weight`, `hidden.weight` and
//! `classifier.weight` decay; the biases and `norm.gamma`, `norm.beta` do not).
use burn::tensor::backend::Backend;

/// Token ids are below this.
pub const VOCAB: usize = 50;
/// Labels per token.
pub const LABELS: usize = 5;
const WIDTH: usize = 16;

#[path = "../../../examples/support/tagger.rs"]
mod tagger;
pub use tagger::Tagger;

/// The tests' tagger, fresh weights from the backend's generator.
pub fn tagger<B: Backend>(device: &B::Device) -> Tagger<B> {
    Tagger::new(VOCAB, WIDTH, LABELS, device)
}

//! The model the behaviour tests train: a small token classifier, any burn
//! model would do. Its parameters are named so the default weight-decay rule
//! applies to some and not others (`embedding.weight`, `hidden.weight` and
//! `classifier.weight` decay; the biases and `norm.gamma`, `norm.beta` do not).
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// Token ids are below this.
pub const VOCAB: usize = 50;
/// Labels per token.
pub const LABELS: usize = 5;
const WIDTH: usize = 16;

/// Embedding, a hidden layer, a LayerNorm and a classifier, per token.
#[derive(Module, Debug)]
pub struct Tagger<B: Backend> {
    embedding: Embedding<B>,
    hidden: Linear<B>,
    norm: LayerNorm<B>,
    classifier: Linear<B>,
}

impl<B: Backend> Tagger<B> {
    /// Fresh weights from the backend's generator.
    pub fn new(device: &B::Device) -> Self {
        Tagger {
            embedding: EmbeddingConfig::new(VOCAB, WIDTH).init(device),
            hidden: LinearConfig::new(WIDTH, WIDTH).init(device),
            norm: LayerNormConfig::new(WIDTH).init(device),
            classifier: LinearConfig::new(WIDTH, LABELS).init(device),
        }
    }

    /// Logits `[rows, seq, LABELS]` of token ids `[rows, seq]`.
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let hidden = self.hidden.forward(self.embedding.forward(ids)).tanh();
        self.classifier.forward(self.norm.forward(hidden))
    }
}

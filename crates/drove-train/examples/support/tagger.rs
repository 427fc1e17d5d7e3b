//! The small token classifier both examples train: any burn model would do.

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// A small token classifier (embedding, hidden layer, LayerNorm, classifier):
/// any burn model would do. The weights take weight decay, the biases and
/// `norm.*` do not.
#[derive(Module, Debug)]
pub struct Tagger<B: Backend> {
    embedding: Embedding<B>,
    hidden: Linear<B>,
    norm: LayerNorm<B>,
    classifier: Linear<B>,
}

impl<B: Backend> Tagger<B> {
    pub fn new(vocab: usize, width: usize, labels: usize, device: &B::Device) -> Self {
        Tagger {
            embedding: EmbeddingConfig::new(vocab, width).init(device),
            hidden: LinearConfig::new(width, width).init(device),
            norm: LayerNormConfig::new(width).init(device),
            classifier: LinearConfig::new(width, labels).init(device),
        }
    }

    /// Logits `[rows, seq, labels]` of token ids `[rows, seq]`.
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let hidden = self.hidden.forward(self.embedding.forward(ids)).tanh();
        self.classifier.forward(self.norm.forward(hidden))
    }
}

//! The encoder: embeddings, N post-LayerNorm transformer layers, and a
//! token-classification head, as plain burn modules.

use burn::module::{Module, Param};
use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig,
};
use burn::tensor::activation::softmax;

use crate::gelu::gelu;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

use crate::BertConfig;
use crate::dropout::dropout;
use drove_kernels::backends::has_kernels;
use drove_kernels::matmul::Matmul;

use crate::sum_order::{DenseSums, EmbeddingSums, SumOrder, TokenTypes};

/// Word, position and token-type embeddings, summed, normalised, dropped out.
#[derive(Module, Debug)]
pub struct Embeddings<B: Backend> {
    /// Word embeddings `[vocab, hidden]`.
    pub word: Embedding<B>,
    /// Position embeddings `[max_positions, hidden]`.
    pub position: Embedding<B>,
    /// Token-type embeddings `[types, hidden]`.
    pub token_type: Embedding<B>,
    /// LayerNorm.
    pub norm: LayerNorm<B>,
    /// Dropout.
    pub dropout: Dropout,
}

impl<B: Backend> Embeddings<B> {
    /// `ids` and `types`: `[batch, seq]`; returns `[batch, seq, hidden]`.
    /// `sums` chooses how positions and types are added (the same values,
    /// gradients summed in another order).
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        types: impl Into<TokenTypes<B>>,
        sums: EmbeddingSums,
    ) -> Tensor<B, 3> {
        let [batch, seq] = ids.dims();
        let positions = match sums {
            EmbeddingSums::Select => {
                let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &ids.device());
                self.position.forward(positions.reshape([1, seq]).repeat_dim(0, batch))
            }
            // `[1, seq, hidden]`, broadcast over the batch.
            EmbeddingSums::Sliced => self.position.weight.val().slice(0..seq).unsqueeze::<3>(),
        };
        let types = match (types.into(), sums) {
            (TokenTypes::Ids(types), _) => self.token_type.forward(types),
            (TokenTypes::Zero, EmbeddingSums::Select) => self.token_type.forward(ids.zeros_like()),
            // Row 0, `[1, 1, hidden]`, broadcast to every token.
            (TokenTypes::Zero, EmbeddingSums::Sliced) => {
                self.token_type.weight.val().slice(0..1).unsqueeze::<3>()
            }
        };
        let words = match sums {
            EmbeddingSums::Select => self.word.forward(ids),
            // The table's gradient by drove's deterministic scatter where the
            // backend has drove's kernels, burn's lookup elsewhere.
            EmbeddingSums::Sliced => drove_kernels::embedding::lookup(self.word.weight.val(), ids)
                .unwrap_or_else(|(_, ids)| self.word.forward(ids)),
        };
        let x = words + positions + types;
        dropout(&self.dropout, self.norm.forward(x))
    }
}

/// One transformer layer: self-attention and a GELU feed-forward, each with a
/// residual connection followed by LayerNorm (BERT's post-LN).
#[derive(Module, Debug)]
pub struct Layer<B: Backend> {
    /// Query projection.
    pub query: Linear<B>,
    /// Key projection.
    pub key: Linear<B>,
    /// Value projection.
    pub value: Linear<B>,
    /// Attention output projection.
    pub attention_output: Linear<B>,
    /// LayerNorm after attention.
    pub attention_norm: LayerNorm<B>,
    /// Feed-forward in.
    pub intermediate: Linear<B>,
    /// Feed-forward out.
    pub output: Linear<B>,
    /// LayerNorm after the feed-forward.
    pub output_norm: LayerNorm<B>,
    /// Dropout on attention probabilities.
    pub attention_dropout: Dropout,
    /// Dropout on the two residual branches.
    pub dropout: Dropout,
    /// Attention heads.
    pub heads: usize,
}

impl<B: Backend> Layer<B> {
    /// `x`: `[batch, seq, hidden]`; `mask_bias`: `[batch, 1, 1, seq]`, 0 on real
    /// tokens and a large negative number on padding.
    /// `dense` chooses how the dense layers' gradients are summed, `matmul`
    /// which matrix product every product of the layer takes.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        mask_bias: Tensor<B, 4>,
        dense: DenseSums,
        matmul: Matmul,
    ) -> Tensor<B, 3> {
        let [batch, seq, hidden] = x.dims();
        let dense = |linear: &Linear<B>, x: Tensor<B, 3>| self::dense(linear, x, dense, matmul);
        let head = hidden / self.heads;
        let split = |t: Tensor<B, 3>| t.reshape([batch, seq, self.heads, head]).swap_dims(1, 2);
        let q = split(dense(&self.query, x.clone()));
        let k = split(dense(&self.key, x.clone()));
        let v = split(dense(&self.value, x.clone()));
        let scores = matmul.apply(q, k.transpose()) / (head as f64).sqrt() + mask_bias;
        let probs = dropout(&self.attention_dropout, softmax(scores, 3));
        let context = matmul.apply(probs, v).swap_dims(1, 2).reshape([batch, seq, hidden]);
        let attended =
            self.attention_norm.forward(dropout(&self.dropout, dense(&self.attention_output, context)) + x);
        let inner = gelu(dense(&self.intermediate, attended.clone()));
        self.output_norm.forward(dropout(&self.dropout, dense(&self.output, inner)) + attended)
    }
}

/// A linear layer over `[batch, seq, d]`. [`DenseSums::Plain`]: applied to
/// the flattened `[batch * seq, d]` rows, one GEMM for the weight gradient
/// instead of a batched one per sequence whose results are then summed
/// (burn's 3-D path). [`DenseSums::SplitK`]: the rows in `c` chunks times the
/// weight broadcast over them, the bias added on the 3-D output. `matmul`
/// chooses the product ([`Matmul::Burn`] with plain sums is burn's `Linear`,
/// as are plain sums on a backend without drove's kernels, the CPU).
fn dense<B: Backend>(linear: &Linear<B>, x: Tensor<B, 3>, sums: DenseSums, matmul: Matmul) -> Tensor<B, 3> {
    let [batch, seq, d] = x.dims();
    let n = batch * seq;
    if sums == DenseSums::Plain && (matmul == Matmul::Burn || !has_kernels::<B>()) {
        let y = linear.forward(x.reshape([n, d]));
        let out = y.dims()[1];
        return y.reshape([batch, seq, out]);
    }
    let weight = linear.weight.val();
    let out = weight.dims()[1];
    let y = match sums.chunks(n) {
        1 => matmul.apply(x.reshape([n, d]), weight).reshape([batch, seq, out]),
        // burn-autodiff's matmul backward: the weight's gradient is
        // `[c, d, n/c]^T-times-[c, n/c, out] = [c, d, out]`, summed over dim 0
        // because the weight was broadcast from `[1, d, out]`.
        c => matmul.apply(x.reshape([c, n / c, d]), weight.unsqueeze::<3>()).reshape([batch, seq, out]),
    };
    match &linear.bias {
        // The bias gradient: summed over the batch, then over the sequence.
        Some(bias) => y + bias.val().reshape([1, 1, out]),
        None => y,
    }
}

/// The encoder: embeddings and layers.
#[derive(Module, Debug)]
pub struct Bert<B: Backend> {
    /// Embeddings.
    pub embeddings: Embeddings<B>,
    /// Layers.
    pub layers: Vec<Layer<B>>,
    /// How the backward's sums over tokens are laid out (a choice of the
    /// step, not saved with the weights).
    pub sums: SumOrder,
    /// Which matrix product the layers take (a choice of the step, not saved
    /// with the weights): burn's by default, drove's on request.
    pub matmul: Matmul,
}

/// Turns a `[batch, seq]` 0/1 attention mask into the additive bias the layers use.
pub fn mask_bias<B: Backend>(attention_mask: Tensor<B, 2>) -> Tensor<B, 4> {
    let [batch, seq] = attention_mask.dims();
    // (1 - mask) * -1e4: padding gets exp(-1e4) = 0 in f32, as with HF's finfo.min.
    ((attention_mask.neg() + 1.0) * -10_000.0).reshape([batch, 1, 1, seq])
}

impl<B: Backend> Bert<B> {
    /// Last hidden states `[batch, seq, hidden]`.
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        types: impl Into<TokenTypes<B>>,
        attention_mask: Tensor<B, 2>,
    ) -> Tensor<B, 3> {
        let bias = mask_bias(attention_mask);
        let mut x = self.embeddings.forward(ids, types, self.sums.embeddings);
        for layer in &self.layers {
            x = layer.forward(x, bias.clone(), self.sums.dense, self.matmul);
        }
        x
    }
}

/// BERT with a linear classifier over each token's last hidden state.
#[derive(Module, Debug)]
pub struct BertForTokenClassification<B: Backend> {
    /// The encoder.
    pub bert: Bert<B>,
    /// Dropout before the classifier.
    pub dropout: Dropout,
    /// `[hidden] -> [labels]`.
    pub classifier: Linear<B>,
}

impl<B: Backend> BertForTokenClassification<B> {
    /// Logits `[batch, seq, labels]`.
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        types: impl Into<TokenTypes<B>>,
        attention_mask: Tensor<B, 2>,
    ) -> Tensor<B, 3> {
        let hidden = self.bert.forward(ids, types, attention_mask);
        dense(&self.classifier, dropout(&self.dropout, hidden), self.bert.sums.dense, self.bert.matmul)
    }

    /// This model with its backward's sums laid out as `sums` (the weights
    /// unchanged).
    pub fn with_sum_order(mut self, sums: SumOrder) -> Self {
        self.bert.sums = sums;
        self
    }

    /// This model with its layers' products taken by `matmul` (the weights
    /// unchanged).
    pub fn with_matmul(mut self, matmul: Matmul) -> Self {
        self.bert.matmul = matmul;
        self
    }

    /// Number of labels.
    pub fn num_labels(&self) -> usize {
        self.classifier.weight.dims()[1]
    }
}

fn norm<B: Backend>(c: &BertConfig, device: &B::Device) -> LayerNorm<B> {
    LayerNormConfig::new(c.hidden_size).with_epsilon(c.layer_norm_eps).init(device)
}

fn linear<B: Backend>(d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
    LinearConfig::new(d_in, d_out).init(device)
}

impl BertConfig {
    /// A randomly initialised model (burn's default initialisers).
    pub fn init_token_classification<B: Backend>(
        &self,
        num_labels: usize,
        device: &B::Device,
    ) -> BertForTokenClassification<B> {
        let h = self.hidden_size;
        let embeddings = Embeddings {
            word: EmbeddingConfig::new(self.vocab_size, h).init(device),
            position: EmbeddingConfig::new(self.max_position_embeddings, h).init(device),
            token_type: EmbeddingConfig::new(self.type_vocab_size, h).init(device),
            norm: norm(self, device),
            dropout: DropoutConfig::new(self.hidden_dropout_prob).init(),
        };
        let layers = (0..self.num_hidden_layers)
            .map(|_| Layer {
                query: linear(h, h, device),
                key: linear(h, h, device),
                value: linear(h, h, device),
                attention_output: linear(h, h, device),
                attention_norm: norm(self, device),
                intermediate: linear(h, self.intermediate_size, device),
                output: linear(self.intermediate_size, h, device),
                output_norm: norm(self, device),
                attention_dropout: DropoutConfig::new(self.attention_probs_dropout_prob).init(),
                dropout: DropoutConfig::new(self.hidden_dropout_prob).init(),
                heads: self.num_attention_heads,
            })
            .collect();
        BertForTokenClassification {
            bert: Bert { embeddings, layers, sums: SumOrder::default(), matmul: Matmul::default() },
            dropout: DropoutConfig::new(self.hidden_dropout_prob).init(),
            classifier: linear(h, num_labels, device),
        }
    }
}

/// Replaces a parameter's value, keeping its id and whether it is trained (a
/// tensor made from data does not track gradients by itself).
pub(crate) fn set<B: Backend, const D: usize>(param: &mut Param<Tensor<B, D>>, value: Tensor<B, D>) {
    let trained = param.val().is_require_grad();
    *param = Param::initialized(param.id, value.set_require_grad(trained));
}

//! What the tokenizer makes and the collator pads: one tokenized sentence
//! ([`Example`]), and the label of the positions that take no part in the loss
//! ([`IGNORE_LABEL`]).

/// The label of positions that take no part in the loss (PyTorch's `ignore_index`).
pub const IGNORE_LABEL: i64 = -100;

/// One tokenized sentence.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Example {
    /// Token ids, with `[CLS]` and `[SEP]`.
    pub input_ids: Vec<u32>,
    /// One label per token: the word's label id on its first subword,
    /// [`IGNORE_LABEL`] elsewhere.
    pub labels: Vec<i64>,
    /// The word each token belongs to (`None` for special tokens).
    pub word_ids: Vec<Option<u32>>,
    /// True for special tokens, which are never masked.
    pub special: Vec<bool>,
}

impl Example {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// Whether there is no token.
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }
}

//! WordPiece tokenization of pre-split words (through the `tokenizers` crate) and
//! alignment of word labels to subwords: the first subword of a word keeps the
//! word's label, the other subwords and the special tokens get [`IGNORE_LABEL`].

use std::path::{Path, PathBuf};

use tokenizers::models::wordpiece::WordPiece;
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::processors::bert::BertProcessing;
use tokenizers::{InputSequence, Tokenizer, TruncationParams};

use crate::conll::{LabelSet, Sentence};
use crate::example::Example;

pub use crate::example::IGNORE_LABEL;

/// An error building the tokenizer or encoding a sentence.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// The vocabulary file could not be loaded.
    #[error("{path}: cannot load WordPiece vocabulary: {message}")]
    Vocab {
        /// The vocab.txt file.
        path: PathBuf,
        /// The cause.
        message: String,
    },
    /// A special token the collator needs is missing from the vocabulary.
    #[error("{path}: vocabulary has no {token} token")]
    MissingToken {
        /// The vocab.txt file.
        path: PathBuf,
        /// The missing token.
        token: &'static str,
    },
    /// The tokenizer failed on a sentence.
    #[error("sentence at line {line}: tokenizer failed: {message}")]
    Encode {
        /// 1-based line of the sentence's first word.
        line: usize,
        /// The cause.
        message: String,
    },
    /// A word's tag is not in the label set.
    #[error("sentence at line {line}: tag {tag:?} is not one of the labels {labels:?}")]
    UnknownLabel {
        /// 1-based line of the word.
        line: usize,
        /// The tag.
        tag: String,
        /// The known labels.
        labels: Vec<String>,
    },
}

/// Ids of the special tokens, and the vocabulary size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SpecialTokens {
    /// `[CLS]`.
    pub cls: u32,
    /// `[SEP]`.
    pub sep: u32,
    /// `[PAD]`.
    pub pad: u32,
    /// `[MASK]`.
    pub mask: u32,
    /// `[UNK]`.
    pub unk: u32,
    /// Number of tokens in the vocabulary.
    pub vocab_size: u32,
}

/// A BERT WordPiece tokenizer built from a `vocab.txt`.
pub struct WordPieceTokenizer {
    inner: Tokenizer,
    special: SpecialTokens,
    max_len: usize,
}

impl WordPieceTokenizer {
    /// Loads `vocab.txt`; `lowercase` for uncased models; sequences are truncated to
    /// `max_len` tokens including `[CLS]` and `[SEP]`.
    pub fn from_vocab(
        path: impl AsRef<Path>,
        lowercase: bool,
        max_len: usize,
    ) -> Result<Self, TokenizeError> {
        let path = path.as_ref();
        let vocab_err = |message: String| TokenizeError::Vocab { path: path.to_path_buf(), message };
        if max_len < 3 {
            return Err(vocab_err(format!(
                "max_len {max_len} leaves no room for a word between [CLS] and [SEP]"
            )));
        }
        let path_str = path.to_str().ok_or_else(|| vocab_err("path is not UTF-8".into()))?;
        if !path.is_file() {
            return Err(vocab_err("no such file".into()));
        }
        let model = WordPiece::from_file(path_str)
            .unk_token("[UNK]".into())
            .build()
            .map_err(|e| vocab_err(e.to_string()))?;
        let mut inner = Tokenizer::new(model);
        let id = |token: &'static str| {
            inner.token_to_id(token).ok_or(TokenizeError::MissingToken { path: path.to_path_buf(), token })
        };
        let special = SpecialTokens {
            cls: id("[CLS]")?,
            sep: id("[SEP]")?,
            pad: id("[PAD]")?,
            mask: id("[MASK]")?,
            unk: id("[UNK]")?,
            vocab_size: inner.get_vocab_size(true) as u32,
        };
        inner
            .with_normalizer(Some(BertNormalizer::new(true, true, None, lowercase)))
            .with_pre_tokenizer(Some(BertPreTokenizer))
            .with_post_processor(Some(BertProcessing::new(
                ("[SEP]".into(), special.sep),
                ("[CLS]".into(), special.cls),
            )));
        inner
            .with_truncation(Some(TruncationParams { max_length: max_len, ..Default::default() }))
            .map_err(|e| vocab_err(e.to_string()))?;
        Ok(WordPieceTokenizer { inner, special, max_len })
    }

    /// The special token ids.
    pub fn special(&self) -> SpecialTokens {
        self.special
    }

    /// The truncation length.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Tokenizes a sentence and aligns its labels. Words cut off by truncation are
    /// dropped; `Example::word_ids` says which words remain.
    pub fn encode(&self, sentence: &Sentence, labels: &LabelSet) -> Result<Example, TokenizeError> {
        let words: Vec<&str> = sentence.words.iter().map(String::as_str).collect();
        let encoding = self
            .inner
            .encode(InputSequence::from(words), true)
            .map_err(|e| TokenizeError::Encode { line: sentence.line, message: e.to_string() })?;
        let ids = encoding.get_ids().to_vec();
        let word_ids = encoding.get_word_ids().to_vec();
        let mut label_ids = Vec::with_capacity(ids.len());
        let mut special = Vec::with_capacity(ids.len());
        let mut previous: Option<u32> = None;
        for (&word, &is_special) in word_ids.iter().zip(encoding.get_special_tokens_mask()) {
            let is_special = is_special != 0 || word.is_none();
            special.push(is_special);
            let label = match word {
                Some(w) if !is_special && previous != Some(w) => {
                    let tag = &sentence.tags[w as usize];
                    labels.id(tag).ok_or_else(|| TokenizeError::UnknownLabel {
                        line: sentence.line + w as usize,
                        tag: tag.clone(),
                        labels: labels.tags().to_vec(),
                    })? as i64
                }
                _ => IGNORE_LABEL,
            };
            label_ids.push(label);
            previous = if is_special { None } else { word };
        }
        Ok(Example { input_ids: ids, labels: label_ids, word_ids, special })
    }

    /// Tokenizes every sentence.
    pub fn encode_all(
        &self,
        sentences: &[Sentence],
        labels: &LabelSet,
    ) -> Result<Vec<Example>, TokenizeError> {
        sentences.iter().map(|s| self.encode(s, labels)).collect()
    }
}

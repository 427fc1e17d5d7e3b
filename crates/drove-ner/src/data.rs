//! The data of a fine-tune: the sets read and tokenized, this rank's loader
//! over the training set, and a collated batch as tensors.

use std::path::Path;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use drove_bert::TokenTypes;
use drove_collate::{
    Batch, Bucketing, Collator, Corpus, DistributedSampler, Example, LabelSet, Loader, LoaderConfig,
    MaskConfig, Masker, Padding, SamplerOptions, WordPieceTokenizer, read_conll,
};

use crate::{DEFAULT_BUCKET_WINDOW, NerError, NerOptions};

/// An evaluation set, tokenized.
pub(crate) struct EvalSet {
    pub(crate) name: String,
    pub(crate) corpus: Corpus,
    pub(crate) examples: Vec<Example>,
}

/// The data of a fine-tune: labels, tokenizer and the tokenized sets.
pub struct NerData {
    /// Labels, from the training set.
    pub labels: LabelSet,
    /// Tokenizer.
    pub tokenizer: WordPieceTokenizer,
    /// Training examples.
    pub train: Vec<Example>,
    pub(crate) eval: Vec<EvalSet>,
}

/// `Ok` if `path` exists, else what is missing and how to get it.
pub(crate) fn require(what: &'static str, path: &Path, hint: &str) -> Result<(), NerError> {
    if path.exists() {
        Ok(())
    } else {
        Err(NerError::Missing { what, path: path.to_path_buf(), hint: hint.to_string() })
    }
}

pub(crate) const FETCH_HINT: &str =
    " (run scripts/fetch-assets.sh, or point --data/--model at the right folder)";

impl NerData {
    /// Reads and tokenizes the sets; a tag in an evaluation set that the
    /// training set never uses is an error naming file and line.
    pub fn load(opts: &NerOptions) -> Result<Self, NerError> {
        require("data folder", &opts.data, FETCH_HINT)?;
        require("model folder", &opts.model, FETCH_HINT)?;
        let vocab = opts.model.join("vocab.txt");
        require("vocabulary", &vocab, FETCH_HINT)?;
        let train_path = opts.data.join("train.txt");
        require("training set", &train_path, FETCH_HINT)?;
        let mut train = read_conll(&train_path)?;
        if let Some(n) = opts.max_train_sentences {
            train.sentences.truncate(n);
        }
        let labels = LabelSet::from_corpus(&train);
        let tokenizer = WordPieceTokenizer::from_vocab(&vocab, opts.lowercase, opts.max_len)
            .map_err(|source| NerError::Tokenize { path: vocab.clone(), source })?;
        let train_examples = tokenizer
            .encode_all(&train.sentences, &labels)
            .map_err(|source| NerError::Tokenize { path: train_path.clone(), source })?;
        let mut eval = Vec::new();
        for name in &opts.eval_sets {
            let path = opts.data.join(format!("{name}.txt"));
            require("evaluation set", &path, FETCH_HINT)?;
            let mut corpus = read_conll(&path)?;
            if let Some(n) = opts.max_eval_sentences {
                corpus.sentences.truncate(n);
            }
            labels.check(&corpus).map_err(|e| match e {
                drove_collate::ConllError::UnknownTag { path, line, tag, .. } => {
                    drove_collate::ConllError::UnknownTag {
                        path,
                        line,
                        tag,
                        reason: format!(
                            "never seen in the training set {} (its labels: {:?})",
                            train_path.display(),
                            labels.tags()
                        ),
                    }
                }
                other => other,
            })?;
            let examples = tokenizer
                .encode_all(&corpus.sentences, &labels)
                .map_err(|source| NerError::Tokenize { path: path.clone(), source })?;
            eval.push(EvalSet { name: name.clone(), corpus, examples });
        }
        Ok(NerData { labels, tokenizer, train: train_examples, eval })
    }
}

/// A collated batch as the replica splits it: by its rows (the trait and the
/// type live in crates that do not know each other).
pub(crate) struct BatchRows<'a>(pub(crate) &'a Batch);

impl drove_train::Rows for BatchRows<'_> {
    fn rows(&self) -> usize {
        self.0.batch_size
    }
}

/// This rank's shard of each epoch's order from position `start` on,
/// masked from its own streams.
pub(crate) fn training_loader(
    opts: &NerOptions,
    data: &NerData,
    rank: usize,
    world: usize,
    start: usize,
) -> Result<Loader, NerError> {
    let special = data.tokenizer.special();
    let masker = if opts.augment_mask > 0.0 {
        Some(
            Masker::new(
                MaskConfig { probability: opts.augment_mask, ..MaskConfig::default() },
                special.mask,
                special.vocab_size,
            )
            .map_err(|e| NerError::Options(e.to_string()))?,
        )
    } else {
        None
    };
    // Sequential streams advance by max_len draws per row whatever the padding,
    // as the story's collate padded to max_length: naive seeding then gives every
    // rank the same pattern, as it did there.
    let collator = Arc::new(
        Collator::new(special.pad, Padding::Longest { multiple_of: opts.pad_multiple.unwrap_or(1) }, masker)
            .with_stream_width(opts.max_len),
    );
    let train: Arc<[Example]> = data.train.clone().into();
    let sampler = DistributedSampler::new(
        train.len(),
        SamplerOptions { world_size: world, rank, seed: opts.seed, ..SamplerOptions::default() },
    )
    .map_err(|e| NerError::Options(e.to_string()))?
    .starting_at(start);
    Ok(Loader::new(
        train,
        sampler,
        collator,
        LoaderConfig {
            batch_size: opts.batch_size,
            workers: opts.workers.max(1),
            prefetch: 2,
            drop_last: false,
            bucketing: Some(opts.bucket_window.unwrap_or(DEFAULT_BUCKET_WINDOW))
                .filter(|&window| window > 0)
                .map(|window_batches| Bucketing { window_batches }),
            seeding: opts.seeding,
            seed: opts.seed,
        },
    )?)
}

/// Token ids, token types (all 0, a single segment: no tensor needed) and
/// the attention mask of `batch`.
pub(crate) fn batch_tensors<B: Backend>(
    batch: &Batch,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, TokenTypes<B>, Tensor<B, 2>) {
    let shape = [batch.batch_size, batch.seq_len];
    let ids: Vec<i64> = batch.input_ids.iter().map(|&t| i64::from(t)).collect();
    let ids: Tensor<B, 2, Int> = drove_kernels::transfer::upload(TensorData::new(ids, shape), device);
    let types = TokenTypes::Zero;
    let mask: Vec<f32> = batch.attention_mask.iter().map(|&m| f32::from(m)).collect();
    let mask: Tensor<B, 2> = drove_kernels::transfer::upload(TensorData::new(mask, shape), device);
    (ids, types, mask)
}

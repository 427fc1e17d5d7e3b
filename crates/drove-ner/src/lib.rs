//! # drove-ner: fine-tuning a BERT for named-entity recognition on N ranks
//!
//! The application of drove's pieces: CoNLL-format data read and collated by
//! `drove-collate` (masked as augmentation from per-sample streams), a BERT
//! token classifier from `drove-bert`, and the distributed step of
//! `drove-train` ([`drove_train::Replica`]) through the [`Collective`] trait.
//! It lives apart from `drove-train` so that a user of the generic step does
//! not depend on tokenizers or on BERT.
//!
//! Each step: the rank's batch (its shard, masked as augmentation from its own
//! stream), forward, a token-level cross-entropy normalised by the labelled
//! tokens of the **global** batch (so N ranks x B rows equal one rank x N*B rows
//! exactly), backward, gradients averaged across ranks, clipped by their global
//! norm, and an AdamW update with warmup and linear decay. Every epoch the ranks
//! evaluate their slices of the evaluation sets, sum entity-level TP/FP/FN across
//! ranks, and rank 0 writes the predictions and a checkpoint.
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor, TensorData};
use drove_bert::{BertConfig, BertForTokenClassification};
use drove_collate::diag::{AgreementAccumulator, AgreementReport, RowMasks, Verdict};
use drove_collate::entities::EntityCounts;
use drove_collate::{
    Batch, Bucketing, Collator, Corpus, DistributedSampler, Example, LabelSet, Loader, LoaderConfig,
    MaskConfig, MaskSeeding, Masker, Padding, WordPieceTokenizer, read_conll,
};
use drove_comm::{Buffer, Collective, Element, ReduceOptions};
use drove_seed::StreamKey;
use drove_train::timeline::{Timeline, Traced, Track};

use drove_train::checkpoint::{self, LoopState};
use drove_train::device::BucketAllReduce;
use drove_train::flat::{AdamWSettings, cosine};
use drove_train::micro::MicroBatches;
use drove_train::schedule::LrScaling;
use drove_train::{LossReduction, Placement, Replica, ReplicaOptions, Schedule};

/// Everything a fine-tune needs to know.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NerOptions {
    /// Folder with `train.txt`, `valid.txt`, `test.txt` (CoNLL-2003 format).
    pub data: PathBuf,
    /// Folder with `config.json`, `model.safetensors`, `vocab.txt`.
    pub model: PathBuf,
    /// Output folder (checkpoints, predictions, summary).
    pub out: PathBuf,
    /// Epochs.
    pub epochs: usize,
    /// Rows per batch on each rank.
    pub batch_size: usize,
    /// Peak learning rate before scaling by world size.
    pub lr: f64,
    /// How the learning rate grows with the world size.
    pub lr_scaling: LrScaling,
    /// Fraction of the steps spent warming up.
    pub warmup_fraction: f64,
    /// AdamW settings.
    pub adamw: AdamWSettings,
    /// Clip gradients to this global norm (0: no clipping).
    pub clip_norm: f64,
    /// Truncation length in tokens.
    pub max_len: usize,
    /// Lowercase before WordPiece (uncased models such as MiniLM).
    pub lowercase: bool,
    /// Probability of masking a token as augmentation (0: none).
    pub augment_mask: f64,
    /// How the masks are seeded.
    pub seeding: MaskSeeding,
    /// Base seed.
    pub seed: u64,
    /// Compare ranks' masks and gradients every N steps (0: never).
    pub diagnose_every: usize,
    /// What the diversity alarm does when a diagnosed step's masks are
    /// identical across ranks: warn (the default) or fail the run.
    #[serde(default)]
    pub on_identical_masks: MaskAlarm,
    /// Write a Chrome trace-event timeline of every rank's steps here (rank 0
    /// writes it at the end; see [`drove_train::timeline`]).
    #[serde(default)]
    pub timeline: Option<PathBuf>,
    /// The parameter whose local gradients the diagnostic compares.
    pub diagnose_parameter: String,
    /// Use only the first N training sentences.
    pub max_train_sentences: Option<usize>,
    /// Use only the first N sentences of each evaluation set.
    pub max_eval_sentences: Option<usize>,
    /// Evaluate on these sets at the end of every epoch (`valid`, `test`).
    pub eval_sets: Vec<String>,
    /// Also checkpoint every N steps within an epoch (0: only at epoch ends).
    pub checkpoint_every: usize,
    /// Loader threads per rank.
    pub workers: usize,
    /// Split each rank's batch into this many micro-batches, run at once on
    /// threads of their own, their gradients summed (0: one per thread of the
    /// rank's rayon pool). Dropout masks do not depend on the split, so only
    /// the order of floating-point sums does.
    #[serde(default)]
    pub micro_batches: usize,
    /// Where parameters and optimizer state live (host buffers or backend
    /// tensors).
    #[serde(default)]
    pub placement: Placement,
    /// Sort windows of this many batches by length (0: no bucketing).
    pub bucket_window: usize,
    /// Override the dropout of `config.json` (e.g. 0 for exact comparisons).
    pub dropout: Option<f64>,
    /// Continue from the latest checkpoint in `out`.
    pub resume: bool,
    /// Stop after this many optimiser steps in this process (for tests and
    /// benchmarks; the schedule still spans the whole run).
    pub max_steps: Option<u64>,
    /// Start from random weights of `config.json`'s shape instead of
    /// `model.safetensors` (throughput where the weights are not at hand).
    #[serde(default)]
    pub random_init: bool,
}

impl Default for NerOptions {
    fn default() -> Self {
        NerOptions {
            data: PathBuf::from("assets/conll2003"),
            model: PathBuf::from("assets/minilm"),
            out: PathBuf::from("runs/ner"),
            epochs: 3,
            batch_size: 32,
            lr: 5e-5,
            lr_scaling: LrScaling::Linear,
            warmup_fraction: 0.1,
            adamw: AdamWSettings::default(),
            clip_norm: 1.0,
            max_len: 128,
            lowercase: true,
            augment_mask: 0.0,
            seeding: MaskSeeding::PerSample,
            seed: 42,
            diagnose_every: 0,
            on_identical_masks: MaskAlarm::Warn,
            timeline: None,
            diagnose_parameter: String::from("bert.layers.last.query.weight"),
            max_train_sentences: None,
            max_eval_sentences: None,
            eval_sets: vec!["valid".into(), "test".into()],
            checkpoint_every: 0,
            workers: 2,
            micro_batches: 0,
            placement: Placement::Host,
            bucket_window: 16,
            dropout: None,
            resume: false,
            max_steps: None,
            random_init: false,
        }
    }
}

/// A fine-tune that cannot start or could not go on.
#[derive(Debug, thiserror::Error)]
pub enum NerError {
    /// A missing asset folder or file.
    #[error("{what} {path} does not exist{hint}")]
    Missing {
        /// What was expected.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// How to get it.
        hint: String,
    },
    /// Bad data.
    #[error(transparent)]
    Data(#[from] drove_collate::ConllError),
    /// Tokenization failed.
    #[error("{path}: {source}")]
    Tokenize {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: drove_collate::TokenizeError,
    },
    /// A bad model.
    #[error(transparent)]
    Model(#[from] drove_bert::BertError),
    /// Bad settings.
    #[error("invalid option: {0}")]
    Options(String),
    /// The loader failed.
    #[error(transparent)]
    Loader(#[from] drove_collate::LoaderError),
    /// An evaluation batch could not be formed.
    #[error(transparent)]
    Collate(#[from] drove_collate::CollateError),
    /// A collective failed (a rank died or disagreed).
    #[error(transparent)]
    Comm(#[from] drove_comm::CommError),
    /// A step failed.
    #[error(transparent)]
    Train(#[from] drove_train::TrainError),
    /// The diversity alarm with `--on-identical-masks fail`: every rank
    /// stopped at a diagnosed step whose masks were identical across ranks.
    #[error("the diversity alarm stopped the run at {message}")]
    IdenticalMasks {
        /// The step.
        step: u64,
        /// The step and what the alarm means.
        message: String,
    },
    /// A checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    /// An output file could not be written.
    #[error("{path}: {message}")]
    Output {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

/// One optimiser step, as seen by one rank.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StepReport {
    /// Optimiser steps taken so far (this one included).
    pub step: u64,
    /// Total steps of the run.
    pub total_steps: u64,
    /// Epoch.
    pub epoch: usize,
    /// Mean token loss of this rank's batch.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Sentences per second across all ranks, over this step.
    pub sentences_per_s: f64,
    /// Real tokens per second across all ranks, over this step.
    pub tokens_per_s: f64,
    /// Time in each phase of the replica's step. On a GPU a phase ends at its
    /// host sync (compute: each micro-batch's loss value; clip: the norm), so
    /// the update's queued kernels are counted in the next step's compute.
    pub phases: drove_train::PhaseTimes,
}

/// One evaluation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalReport {
    /// Which set.
    pub set: String,
    /// After which epoch (1-based).
    pub epoch: usize,
    /// Step.
    pub step: u64,
    /// Entity counts, summed over ranks.
    pub tp: u64,
    /// False positives.
    pub fp: u64,
    /// False negatives.
    pub fn_: u64,
    /// Precision.
    pub precision: f64,
    /// Recall.
    pub recall: f64,
    /// F1.
    pub f1: f64,
    /// Sentences evaluated.
    pub sentences: usize,
}

/// What the diversity alarm does when masks are identical across ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaskAlarm {
    /// Warn once and go on.
    #[default]
    Warn,
    /// Stop every rank at that step ([`NerError::IdenticalMasks`]).
    Fail,
}

impl std::str::FromStr for MaskAlarm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "warn" => Ok(MaskAlarm::Warn),
            "fail" => Ok(MaskAlarm::Fail),
            _ => Err(format!("the diversity alarm is warn or fail, found {s:?}")),
        }
    }
}

/// One diagnostic comparison across ranks.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DiagnoseReport {
    /// Step.
    pub step: u64,
    /// The mask comparison over every diagnosed step so far (this one
    /// included): agreement, its expected value and band, the verdict
    /// ([`AgreementReport::is_alarm`], [`AgreementReport::explain`]).
    pub masks: AgreementReport,
    /// Mean over pairs of ranks of the fraction of positions (maskable on both)
    /// where the masks agree.
    pub mask_agreement: f64,
    /// This step's agreement of independent masks, `p^2 + (1-p)^2`.
    pub mask_expected: f64,
    /// The standard deviation of this step's agreement for independent masks
    /// (its 3-sigma band is `mask_expected +- 3 mask_sigma`).
    pub mask_sigma: f64,
    /// Mean over pairs of ranks of the cosine similarity of their local gradients.
    pub grad_cosine: f64,
}

/// What the loop tells its caller as it goes (progress bars, metrics).
pub trait Observer {
    /// Before the first step: steps already done and in total.
    fn started(&mut self, _done: u64, _total: u64) {}
    /// After every step.
    fn step(&mut self, _report: &StepReport) {}
    /// After every evaluation.
    fn evaluated(&mut self, _report: &EvalReport) {}
    /// After every diagnostic comparison.
    fn diagnosed(&mut self, _report: &DiagnoseReport) {}
    /// The diversity alarm, once per run: the first diagnosed step whose masks
    /// are not independent across ranks (identical, or anti-correlated).
    fn alarm(&mut self, _report: &DiagnoseReport) {}
    /// A line worth showing (loading, checkpoints).
    fn note(&mut self, _message: &str) {}
}

/// An observer that ignores everything.
pub struct Quiet;
impl Observer for Quiet {}

/// The outcome of a fine-tune.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NerSummary {
    /// Ranks.
    pub world_size: usize,
    /// Steps taken in total (including before a resume).
    pub steps: u64,
    /// Evaluations, in order.
    pub evaluations: Vec<EvalReport>,
    /// The last test evaluation's F1, if the test set was evaluated.
    pub test_f1: Option<f64>,
    /// Mask agreement over every diagnosed step of this process, with its
    /// expected value and sigma.
    pub mask_agreement: Option<AgreementReport>,
    /// Mean gradient cosine over the diagnosed steps.
    pub grad_cosine: Option<f64>,
    /// The diversity alarm, if it went off: its step and what it means.
    pub diversity_alarm: Option<String>,
    /// Training sentences per second (all ranks) over this process's steps.
    pub sentences_per_s: f64,
    /// Real tokens per second (all ranks).
    pub tokens_per_s: f64,
    /// Seconds spent in training steps.
    pub train_seconds: f64,
    /// The last checkpoint written.
    pub checkpoint: Option<PathBuf>,
}

/// An evaluation set, tokenized.
struct EvalSet {
    name: String,
    corpus: Corpus,
    examples: Vec<Example>,
}

/// The data of a fine-tune: labels, tokenizer and the tokenized sets.
pub struct NerData {
    /// Labels, from the training set.
    pub labels: LabelSet,
    /// Tokenizer.
    pub tokenizer: WordPieceTokenizer,
    /// Training examples.
    pub train: Vec<Example>,
    eval: Vec<EvalSet>,
}

fn require(what: &'static str, path: &Path, hint: &str) -> Result<(), NerError> {
    if path.exists() {
        Ok(())
    } else {
        Err(NerError::Missing { what, path: path.to_path_buf(), hint: hint.to_string() })
    }
}

const FETCH_HINT: &str = " (run scripts/fetch-assets.sh, or point --data/--model at the right folder)";

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

/// Reads `config.json` (with the dropout override) and loads the weights into a
/// token classifier for `labels` labels; the classifier head starts from the
/// seed's initialisation stream on every rank.
pub fn load_model<B: Backend>(
    opts: &NerOptions,
    labels: usize,
    device: &B::Device,
) -> Result<(BertForTokenClassification<B>, drove_bert::LoadReport), NerError> {
    let config_path = opts.model.join("config.json");
    require("model config", &config_path, FETCH_HINT)?;
    let weights = opts.model.join("model.safetensors");
    if !opts.random_init {
        require("model weights", &weights, FETCH_HINT)?;
    }
    let mut config = BertConfig::from_file(&config_path)?;
    if let Some(p) = opts.dropout {
        config.hidden_dropout_prob = p;
        config.attention_probs_dropout_prob = p;
    }
    B::seed(device, StreamKey::init(opts.seed).derive().words()[0]);
    let mut model = config.init_token_classification::<B>(labels, device);
    if opts.random_init {
        let report = drove_bert::LoadReport { missing: Vec::new(), unexpected: Vec::new(), loaded: 0 };
        return Ok((model, report));
    }
    let report = drove_bert::load_safetensors(&mut model, &weights, device).map_err(|e| match e {
        drove_bert::BertError::Shape { path, tensor, expected, found } => drove_bert::BertError::Config {
            path: config_path.clone(),
            message: format!(
                "sizes disagree with {}: tensor {tensor} has shape {found:?}, but config.json implies {expected:?}",
                path.display()
            ),
        },
        other => other,
    })?;
    Ok((model, report))
}

/// Resolves `bert.layers.last.…` to the last layer's index.
fn resolve_parameter(name: &str, layers: usize) -> String {
    name.replace("layers.last.", &format!("layers.{}.", layers.saturating_sub(1)))
}

/// The token cross-entropy, summed over labelled tokens and multiplied by
/// `scale`; returns the loss tensor and the local mean for display.
fn loss<B: Backend>(
    logits: Tensor<B, 3>,
    labels: &[i64],
    num_labels: usize,
    scale: f64,
    device: &B::Device,
) -> Tensor<B, 1> {
    let [b, s, l] = logits.dims();
    let mut onehot = vec![0f32; b * s * num_labels];
    for (i, &y) in labels.iter().enumerate() {
        if y >= 0 {
            onehot[i * num_labels + y as usize] = 1.0;
        }
    }
    let target = Tensor::<B, 2>::from_data(TensorData::new(onehot, [b * s, l]), device);
    let logp = log_softmax(logits.reshape([b * s, l]), 1);
    (logp * target).sum().neg() * scale
}

fn batch_tensors<B: Backend>(
    batch: &Batch,
    device: &B::Device,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Int>, Tensor<B, 2>) {
    let shape = [batch.batch_size, batch.seq_len];
    let ids: Vec<i64> = batch.input_ids.iter().map(|&t| i64::from(t)).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, shape), device);
    let types = ids.zeros_like();
    let mask: Vec<f32> = batch.attention_mask.iter().map(|&m| f32::from(m)).collect();
    let mask = Tensor::<B, 2>::from_data(TensorData::new(mask, shape), device);
    (ids, types, mask)
}

/// Encodes a batch's masks for the all-gather: rows, width, then one code per
/// position (0: not maskable, 1: maskable, 2: maskable and chosen).
fn encode_masks(batch: &Batch) -> Vec<i32> {
    let mut out = Vec::with_capacity(2 + batch.actions.len());
    out.push(batch.batch_size as i32);
    out.push(batch.seq_len as i32);
    out.extend(
        batch
            .maskable
            .iter()
            .zip(&batch.actions)
            .map(|(&m, a)| i32::from(m) * (1 + i32::from(a.is_chosen()))),
    );
    out
}

fn decode_masks(codes: &[i32]) -> RowMasks {
    let width = codes[1].max(0) as usize;
    RowMasks {
        width,
        chosen: codes[2..].iter().map(|&c| c == 2).collect(),
        maskable: codes[2..].iter().map(|&c| c > 0).collect(),
    }
}

fn split_gathered<T: Clone>(data: &[T], first_dims: &[usize]) -> Vec<Vec<T>> {
    let mut out = Vec::with_capacity(first_dims.len());
    let mut at = 0;
    for &n in first_dims {
        out.push(data[at..at + n].to_vec());
        at += n;
    }
    out
}

/// Fine-tunes on `comm`'s ranks. Every rank calls this with the same options.
///
/// The step is a [`Replica`]'s: this function keeps what is NER (data, the
/// token loss normalised by the global batch, evaluation, predictions and the
/// mask diagnostic) and the loop's position for checkpoints.
pub fn train_ner<B: AutodiffBackend>(
    opts: &NerOptions,
    comm: &dyn Collective,
    observer: &mut dyn Observer,
    device: &B::Device,
) -> Result<NerSummary, NerError> {
    train_ner_with::<B>(opts, comm, observer, device, None)
}

/// [`train_ner`] with the backend placement's gradient all-reduce replaced by
/// `reducer` (NCCL on GPUs: `drove_train::cuda::NcclBuckets`, feature `nccl`);
/// `None` keeps host staging.
pub fn train_ner_with<B: AutodiffBackend>(
    opts: &NerOptions,
    comm: &dyn Collective,
    observer: &mut dyn Observer,
    device: &B::Device,
    reducer: Option<Box<dyn BucketAllReduce<B::InnerBackend>>>,
) -> Result<NerSummary, NerError> {
    let (rank, world) = (comm.rank(), comm.world_size());
    check_options(opts)?;
    let data = NerData::load(opts)?;
    observer.note(&format!(
        "rank {rank}/{world}: {} training sentences, {} labels, evaluation sets {:?}",
        data.train.len(),
        data.labels.len(),
        opts.eval_sets
    ));
    let (model, report) = load_model::<B>(opts, data.labels.len(), device)?;
    if !report.missing.iter().all(|n| n.starts_with("classifier")) {
        return Err(NerError::Options(format!(
            "{}: the weights lack encoder tensors {:?}",
            opts.model.join("model.safetensors").display(),
            report.missing
        )));
    }
    let layers = model.bert.layers.len();
    let loader = training_loader(opts, &data, rank, world)?;
    let steps_per_epoch = loader.plan(0).len();
    let total_steps = (steps_per_epoch * opts.epochs) as u64;
    let timeline = if opts.timeline.is_some() { Timeline::on() } else { Timeline::off() };
    let traced = Traced { inner: comm, timeline: &timeline };
    let comm: &dyn Collective = if timeline.is_on() { &traced } else { comm };
    let mut replica =
        Replica::new(model, comm, replica_options(opts, total_steps), device)?.with_timeline(&timeline);
    if let Some(reducer) = reducer {
        replica = replica.with_bucket_all_reduce(reducer)?;
    }
    let diagnosed = diagnosed_parameter(opts, replica.parameter_names(), layers, world, observer)?;
    let state = LoopState {
        epoch: 0,
        batch: 0,
        global_step: 0,
        world_size: world,
        batch_size: opts.batch_size,
        seed: opts.seed,
        train_sentences: data.train.len(),
        history: Vec::new(),
    };
    let mut fit = Fit {
        opts,
        data: &data,
        replica,
        observer,
        device,
        diagnosed,
        steps_per_epoch,
        total_steps,
        root: opts.out.join("checkpoints"),
        state,
        evaluations: Vec::new(),
        totals: Totals::new(world, opts.augment_mask),
        last_checkpoint: None,
        timeline: &timeline,
    };
    if opts.resume {
        fit.resume()?;
    }
    fit.observer.started(fit.state.global_step, total_steps);
    let mut steps_here = 0u64;
    'epochs: while fit.state.epoch < opts.epochs {
        let mut batches = loader.epoch(fit.state.epoch as u64).enumerate();
        loop {
            let waited = Instant::now();
            let Some((b, batch)) = batches.next() else { break };
            let batch = batch?;
            if b < fit.state.batch {
                continue; // done before the checkpoint we resumed from
            }
            if opts.max_steps.is_some_and(|m| steps_here >= m) {
                break 'epochs;
            }
            timeline.record("data wait", "phase", Track::Main, waited);
            fit.step(b, &batch)?;
            timeline.record(format!("step {}", fit.state.global_step), "step", Track::Main, waited);
            steps_here += 1;
        }
        if fit.state.batch < steps_per_epoch {
            break; // stopped by max_steps
        }
        fit.end_epoch()?;
    }
    let summary = fit.totals.summary(world, fit.state.global_step, fit.evaluations, fit.last_checkpoint);
    if let Some(path) = &opts.timeline {
        timeline
            .write_merged(comm, path)
            .map_err(|e| NerError::Output { path: path.clone(), message: e.to_string() })?;
    }
    if rank == 0 {
        std::fs::create_dir_all(&opts.out)
            .map_err(|e| NerError::Output { path: opts.out.clone(), message: e.to_string() })?;
        let path = opts.out.join("summary.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&summary).expect("a summary serialises"))
            .map_err(|e| NerError::Output { path, message: e.to_string() })?;
    }
    Ok(summary)
}

/// One rank's fine-tune as it goes: the replica, where the loop stands, and
/// what it has measured.
struct Fit<'a, 'c, B: AutodiffBackend> {
    opts: &'a NerOptions,
    data: &'a NerData,
    replica: Replica<'c, B, BertForTokenClassification<B>>,
    observer: &'a mut dyn Observer,
    device: &'a B::Device,
    /// The parameter the diagnostic compares, when it runs.
    diagnosed: Option<usize>,
    steps_per_epoch: usize,
    total_steps: u64,
    /// `OUT/checkpoints`.
    root: PathBuf,
    state: LoopState,
    evaluations: Vec<EvalReport>,
    totals: Totals,
    last_checkpoint: Option<PathBuf>,
    /// Where the loop's phases are recorded (off unless asked for).
    timeline: &'a Timeline,
}

impl<B: AutodiffBackend> Fit<'_, '_, B> {
    /// Loads `latest` into the replica on every rank and takes the loop's
    /// position from it, which must come from a run of the same shape.
    fn resume(&mut self) -> Result<(), NerError> {
        let Some(dir) = checkpoint::latest(&self.root)? else {
            self.observer.note(&format!("no checkpoint in {}: starting afresh", self.root.display()));
            return Ok(());
        };
        let json = self.replica.load(&dir)?;
        let s = LoopState::from_json(json).map_err(|e| checkpoint::CheckpointError::Corrupt {
            path: dir.join("state.json"),
            message: format!("not the state of a NER fine-tune ({e})"),
        })?;
        let fresh = &self.state;
        for (what, theirs, ours) in [
            ("world size", s.world_size as u64, fresh.world_size as u64),
            ("batch size", s.batch_size as u64, fresh.batch_size as u64),
            ("training sentences", s.train_sentences as u64, fresh.train_sentences as u64),
            ("seed", s.seed, fresh.seed),
            ("optimizer steps", s.global_step, self.replica.steps()),
        ] {
            if theirs != ours {
                return Err(checkpoint::CheckpointError::Mismatch {
                    path: dir.clone(),
                    message: format!("it was written with {what} {theirs}, this run has {ours}"),
                }
                .into());
            }
        }
        // A position past any run: a damaged state.json, named before it is used.
        if s.epoch > 1 << 32 || s.batch > 1 << 40 {
            return Err(checkpoint::CheckpointError::Corrupt {
                path: dir.join("state.json"),
                message: format!("field `epoch` or `batch` is out of range ({} and {})", s.epoch, s.batch),
            }
            .into());
        }
        self.observer.note(&format!(
            "resumed from {} at epoch {}, batch {}, step {}",
            dir.display(),
            s.epoch + 1,
            s.batch,
            s.global_step
        ));
        self.evaluations = s.history.iter().filter_map(|v| serde_json::from_value(v.clone()).ok()).collect();
        self.state = s;
        self.last_checkpoint = Some(dir);
        Ok(())
    }

    /// One optimizer step on batch `b` of the epoch.
    fn step(&mut self, b: usize, batch: &Batch) -> Result<(), NerError> {
        let (opts, device) = (self.opts, self.device);
        let comm = self.replica.comm();
        let (rank, world) = (comm.rank(), comm.world_size());
        let t0 = Instant::now();
        let step = self.state.global_step + 1;
        // Dropout draws from this rank's stream for this step.
        let dropout_seed = StreamKey::dropout(opts.seed, rank as u32, step).derive().words()[0];
        let local_labelled = batch.labels.iter().filter(|&&y| y >= 0).count();
        let mut counts = [local_labelled as f64, batch.real_tokens() as f64];
        let timeline = self.timeline;
        timeline.span("counts all-reduce", "phase", Track::Main, || {
            comm.all_reduce("step.counts", &[2], f64::tensor_mut(&mut counts), ReduceOptions::sum())
        })?;
        let labelled_global = counts[0].max(1.0);
        let scale = world as f64 / labelled_global;
        let num_labels = self.data.labels.len();
        let computed = Instant::now();
        self.replica.backward(&BatchRows(batch), |model, micro| {
            drove_bert::seed_dropout_rows(dropout_seed, micro.rows.start);
            let part = micro.batch.0.rows(micro.rows.clone());
            let (ids, types, mask) = batch_tensors::<B>(&part, device);
            loss(model.forward(ids, types, mask), &part.labels, num_labels, scale, device)
        })?;
        timeline.record("forward+backward", "phase", Track::Main, computed);
        let diagnosed = Instant::now();
        if let Some(index) = self.diagnosed.filter(|_| step.is_multiple_of(opts.diagnose_every as u64)) {
            let gradient = self.replica.local_gradient(index)?;
            let report = diagnose(comm, batch, &gradient, step, &mut self.totals.agreement)?;
            self.totals.cosines.push(report.grad_cosine);
            self.observer.diagnosed(&report);
            // Every rank computes the same report, so all raise (and stop) together.
            if report.masks.is_alarm() && self.totals.alarm.is_none() {
                let message = format!("step {step}: {}", report.masks.explain());
                self.totals.alarm = Some(message.clone());
                self.observer.alarm(&report);
                if opts.on_identical_masks == MaskAlarm::Fail && report.masks.verdict == Verdict::Identical {
                    // Rank 0 has recorded the alarm (its observer did): all stop together.
                    comm.barrier("diversity alarm")?;
                    return Err(NerError::IdenticalMasks { step, message });
                }
            }
            timeline.record("diagnostic", "phase", Track::Main, diagnosed);
        }
        let outcome = self.replica.apply()?;
        self.state.global_step = step;
        self.state.batch = b + 1;

        let dt = t0.elapsed().as_secs_f64();
        self.totals.add(dt, (batch.batch_size * world) as u64, counts[1] as u64);
        // The loss is scaled for the global batch; report this rank's mean.
        self.observer.step(&StepReport {
            step,
            total_steps: self.total_steps,
            epoch: self.state.epoch + 1,
            loss: outcome.local_loss * labelled_global / world as f64 / local_labelled.max(1) as f64,
            lr: outcome.lr.unwrap_or(0.0),
            grad_norm: outcome.grad_norm.unwrap_or(0.0),
            sentences_per_s: (batch.batch_size * world) as f64 / dt,
            tokens_per_s: counts[1] / dt,
            phases: outcome.times,
        });
        if opts.checkpoint_every > 0
            && step.is_multiple_of(opts.checkpoint_every as u64)
            && self.state.batch < self.steps_per_epoch
        {
            self.checkpoint(&[])?;
        }
        Ok(())
    }

    /// The end of an epoch: every evaluation set, then a checkpoint with the
    /// predictions beside it.
    fn end_epoch(&mut self) -> Result<(), NerError> {
        self.state.epoch += 1;
        self.state.batch = 0;
        let inference = self.replica.model().valid();
        let mut extra = Vec::new();
        for set in &self.data.eval {
            let evaluated = Instant::now();
            let (report, predictions) = evaluate::<B::InnerBackend>(
                &inference,
                set,
                &self.data.labels,
                self.replica.comm(),
                self.state.epoch,
                self.state.global_step,
                self.device,
            )?;
            self.timeline.record(format!("evaluation {}", set.name), "phase", Track::Main, evaluated);
            self.observer.evaluated(&report);
            self.state.history.push(serde_json::to_value(&report).expect("a report serialises"));
            self.evaluations.push(report);
            if let Some(text) = predictions {
                extra.push((format!("{}.predictions.conll", set.name), text));
            }
        }
        self.checkpoint(&extra)
    }

    /// Every rank meets; rank 0 writes the checkpoint (keeping the newest two).
    fn checkpoint(&mut self, extra: &[(String, Vec<u8>)]) -> Result<(), NerError> {
        let started = Instant::now();
        let saved = self.replica.save(&self.root, &self.state, extra, 2);
        self.timeline.record("checkpoint", "phase", Track::Main, started);
        if let Some(dir) = saved? {
            self.observer.note(&format!("checkpoint {}", dir.display()));
            self.last_checkpoint = Some(dir);
        }
        Ok(())
    }
}

/// A collated batch as the replica splits it: by its rows (the trait and the
/// type live in crates that do not know each other).
struct BatchRows<'a>(&'a Batch);

impl drove_train::Rows for BatchRows<'_> {
    fn rows(&self) -> usize {
        self.0.batch_size
    }
}

fn check_options(opts: &NerOptions) -> Result<(), NerError> {
    if opts.batch_size == 0 || opts.epochs == 0 {
        return Err(NerError::Options("--batch-size and --epochs must be at least 1".into()));
    }
    if !(0.0..=1.0).contains(&opts.augment_mask) {
        return Err(NerError::Options(format!(
            "--augment-mask must be in [0, 1], found {}",
            opts.augment_mask
        )));
    }
    Ok(())
}

/// The step of a fine-tune: AdamW with warmup and linear decay over the whole
/// run, a loss the loop normalises itself (by the global batch's labelled
/// tokens), and at most one micro-batch per row.
fn replica_options(opts: &NerOptions, total_steps: u64) -> ReplicaOptions {
    ReplicaOptions {
        lr: opts.lr,
        lr_scaling: opts.lr_scaling,
        schedule: Schedule::warmup_linear(opts.warmup_fraction, total_steps),
        adamw: opts.adamw,
        clip_norm: opts.clip_norm,
        micro_batches: MicroBatches::resolve(opts.micro_batches, opts.batch_size),
        loss: LossReduction::Sum,
        placement: opts.placement,
        ..ReplicaOptions::default()
    }
}

/// This rank's shard, masked from its own streams.
fn training_loader(opts: &NerOptions, data: &NerData, rank: usize, world: usize) -> Result<Loader, NerError> {
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
        Collator::new(special.pad, Padding::Longest { multiple_of: 1 }, masker)
            .with_stream_width(opts.max_len),
    );
    let train: Arc<[Example]> = data.train.clone().into();
    let sampler = DistributedSampler::new(train.len(), world, rank, opts.seed)
        .map_err(|e| NerError::Options(e.to_string()))?;
    Ok(Loader::new(
        train,
        sampler,
        collator,
        LoaderConfig {
            batch_size: opts.batch_size,
            workers: opts.workers.max(1),
            prefetch: 2,
            drop_last: false,
            bucketing: (opts.bucket_window > 0).then_some(Bucketing { window_batches: opts.bucket_window }),
            seeding: opts.seeding,
            seed: opts.seed,
        },
    )?)
}

/// The index of the parameter the diagnostic compares, when it runs.
fn diagnosed_parameter(
    opts: &NerOptions,
    names: &[String],
    layers: usize,
    world: usize,
    observer: &mut dyn Observer,
) -> Result<Option<usize>, NerError> {
    if opts.diagnose_every == 0 {
        return Ok(None);
    }
    if world < 2 {
        observer.note("--diagnose-every compares ranks: with one rank there is nothing to compare; ignored");
        return Ok(None);
    }
    let name = resolve_parameter(&opts.diagnose_parameter, layers);
    names.iter().position(|n| *n == name).map(Some).ok_or_else(|| {
        NerError::Options(format!(
            "--diagnose-parameter {name:?} is not a parameter; some that are: {:?}",
            &names[names.len().saturating_sub(6)..]
        ))
    })
}

/// Throughput and diagnostics over this process's steps.
struct Totals {
    agreement: AgreementAccumulator,
    cosines: Vec<f64>,
    alarm: Option<String>,
    sentences: u64,
    tokens: u64,
    seconds: f64,
}

impl Totals {
    fn new(world: usize, mask_probability: f64) -> Self {
        Totals {
            agreement: AgreementAccumulator::new(world, mask_probability),
            cosines: Vec::new(),
            alarm: None,
            sentences: 0,
            tokens: 0,
            seconds: 0.0,
        }
    }

    fn add(&mut self, seconds: f64, sentences: u64, tokens: u64) {
        self.seconds += seconds;
        self.sentences += sentences;
        self.tokens += tokens;
    }

    fn summary(
        self,
        world: usize,
        steps: u64,
        evaluations: Vec<EvalReport>,
        checkpoint: Option<PathBuf>,
    ) -> NerSummary {
        let per_s = |n: u64| if self.seconds > 0.0 { n as f64 / self.seconds } else { 0.0 };
        let agreement = self.agreement.report();
        NerSummary {
            world_size: world,
            steps,
            test_f1: evaluations.iter().rev().find(|e| e.set == "test").map(|e| e.f1),
            evaluations,
            mask_agreement: (agreement.steps > 0).then_some(agreement),
            grad_cosine: (!self.cosines.is_empty())
                .then(|| self.cosines.iter().sum::<f64>() / self.cosines.len() as f64),
            diversity_alarm: self.alarm,
            sentences_per_s: per_s(self.sentences),
            tokens_per_s: per_s(self.tokens),
            train_seconds: self.seconds,
            checkpoint,
        }
    }
}

/// All-gathers this step's masks and the local gradient of the diagnosed
/// parameter; every rank computes the same report.
fn diagnose(
    comm: &dyn Collective,
    batch: &Batch,
    grad: &[f32],
    step: u64,
    run: &mut AgreementAccumulator,
) -> Result<DiagnoseReport, NerError> {
    let codes = encode_masks(batch);
    let gathered = comm.all_gather("diagnose.masks", &[codes.len()], i32::tensor_ref(&codes))?;
    let Buffer::I32(all) = gathered.data else { unreachable!("gathered i32") };
    let masks: Vec<RowMasks> =
        split_gathered(&all, &gathered.first_dims).iter().map(|c| decode_masks(c)).collect();
    let mut this_step = AgreementAccumulator::new(masks.len(), run.probability());
    this_step.add_step(&masks);
    run.add_step(&masks);
    // The verdict over every diagnosed step so far: one step of a small batch
    // may compare too few positions to be sure.
    let so_far = run.report();
    let gathered = comm.all_gather("diagnose.gradient", &[grad.len()], f32::tensor_ref(grad))?;
    let Buffer::F32(all) = gathered.data else { unreachable!("gathered f32") };
    let grads = split_gathered(&all, &gathered.first_dims);
    let (mut sum, mut pairs) = (0f64, 0u64);
    for a in 0..grads.len() {
        for b in a + 1..grads.len() {
            sum += cosine(&grads[a], &grads[b]);
            pairs += 1;
        }
    }
    let report = this_step.report();
    Ok(DiagnoseReport {
        step,
        masks: so_far,
        mask_agreement: report.mean_agreement,
        mask_expected: report.expected,
        mask_sigma: report.sigma,
        grad_cosine: if pairs == 0 { 1.0 } else { sum / pairs as f64 },
    })
}

/// Evaluates this rank's slice (sentences `rank`, `rank + W`, ...) of `set`,
/// sums the entity counts across ranks and, on rank 0, returns the CoNLL
/// predictions file of the whole set.
fn evaluate<B: Backend>(
    model: &BertForTokenClassification<B>,
    set: &EvalSet,
    labels: &LabelSet,
    comm: &dyn Collective,
    epoch: usize,
    step: u64,
    device: &B::Device,
) -> Result<(EvalReport, Option<Vec<u8>>), NerError> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let mut mine: Vec<usize> = (rank..set.examples.len()).step_by(world).collect();
    mine.sort_by_key(|&i| set.examples[i].len());
    let collator = Collator::new(0, Padding::Longest { multiple_of: 1 }, None);
    let mut counts = EntityCounts::default();
    // Encoded as [sentence, words, label ids...] per sentence, for the gather.
    let mut encoded: Vec<i32> = Vec::new();
    for chunk in mine.chunks(64) {
        let examples: Vec<&Example> = chunk.iter().map(|&i| &set.examples[i]).collect();
        let batch = collator.collate(&examples, chunk, drove_collate::MaskSource::None)?;
        let (ids, types, mask) = batch_tensors::<B>(&batch, device);
        let predicted = model.forward(ids, types, mask).argmax(2);
        let predicted: Vec<i64> = predicted
            .into_data()
            .convert::<i64>()
            .to_vec::<i64>()
            .map_err(|e| NerError::Options(format!("reading predictions: {e:?}")))?;
        for (r, &i) in chunk.iter().enumerate() {
            let sentence = &set.corpus.sentences[i];
            let example = &set.examples[i];
            let mut words = vec![0usize; sentence.words.len()]; // "O" where truncated away
            for (t, (&w, &y)) in example.word_ids.iter().zip(&example.labels).enumerate() {
                if let (Some(w), true) = (w, y >= 0) {
                    words[w as usize] = predicted[r * batch.seq_len + t].max(0) as usize;
                }
            }
            let tags: Vec<&str> = words.iter().map(|&k| labels.tags()[k].as_str()).collect();
            counts.add(EntityCounts::sentence(&sentence.tags, &tags));
            encoded.push(i as i32);
            encoded.push(words.len() as i32);
            encoded.extend(words.iter().map(|&k| k as i32));
        }
    }
    let mut sums = [counts.tp as i64, counts.fp as i64, counts.fn_ as i64];
    comm.all_reduce("eval.counts", &[3], i64::tensor_mut(&mut sums), ReduceOptions::sum())?;
    let total = EntityCounts { tp: sums[0] as u64, fp: sums[1] as u64, fn_: sums[2] as u64 };
    let gathered = comm.all_gather("eval.predictions", &[encoded.len()], i32::tensor_ref(&encoded))?;
    let text = if rank == 0 {
        let Buffer::I32(all) = gathered.data else { unreachable!("gathered i32") };
        let mut per_sentence: Vec<Vec<usize>> = vec![Vec::new(); set.corpus.sentences.len()];
        let mut at = 0;
        while at + 1 < all.len() {
            let (i, n) = (all[at] as usize, all[at + 1] as usize);
            per_sentence[i] = all[at + 2..at + 2 + n].iter().map(|&k| k as usize).collect();
            at += 2 + n;
        }
        let mut out = String::new();
        for (s, predicted) in set.corpus.sentences.iter().zip(&per_sentence) {
            for (k, (word, gold)) in s.words.iter().zip(&s.tags).enumerate() {
                let p = predicted.get(k).map_or("O", |&id| labels.tags()[id].as_str());
                out.push_str(&format!("{word} {gold} {p}\n"));
            }
            out.push('\n');
        }
        Some(out.into_bytes())
    } else {
        None
    };
    Ok((
        EvalReport {
            set: set.name.clone(),
            epoch,
            step,
            tp: total.tp,
            fp: total.fp,
            fn_: total.fn_,
            precision: total.precision(),
            recall: total.recall(),
            f1: total.f1(),
            sentences: set.examples.len(),
        },
        text,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_layer_alias_resolves() {
        assert_eq!(resolve_parameter("bert.layers.last.query.weight", 6), "bert.layers.5.query.weight");
        assert_eq!(resolve_parameter("classifier.weight", 6), "classifier.weight");
    }

    #[test]
    fn masks_survive_the_encoding() {
        use drove_collate::MaskAction;
        let batch = Batch {
            batch_size: 1,
            seq_len: 4,
            maskable: vec![false, true, true, false],
            actions: vec![MaskAction::None, MaskAction::Mask, MaskAction::None, MaskAction::None],
            ..Batch::default()
        };
        let masks = decode_masks(&encode_masks(&batch));
        assert_eq!(masks, RowMasks::from(&batch));
    }
}

//! The settings of a fine-tune: [`NerOptions`], one type for the library and
//! the command line (with the `clap` feature it is also `drove train ner`'s
//! flags, their help and their defaults).

use std::path::PathBuf;

#[cfg(feature = "clap")]
use crate::flags;
use drove_collate::MaskSeeding;
use drove_device::GradientPath;
use drove_device::kernels::KernelCache;
use drove_train::flat::AdamWSettings;
use drove_train::micro::MicroBatches;
use drove_train::schedule::LrScaling;
use drove_train::{LossReduction, Placement, ReplicaOptions, Schedule, SparseRows};

use crate::NerError;
use crate::gpu_step::GpuStep;

/// Everything a fine-tune needs to know.
///
/// With the `clap` feature these are also the flags of `drove train ner`, the
/// doc comments their help. Where a flag is spelled apart from its field
/// (`--cased` for `lowercase`, `--warmup`, `--weight-decay`, `--eval`) it says
/// so; `diagnose_every`, `placement` and `random_init` are no flags here: their
/// defaults depend on what only the command knows (the world size, the
/// device), so it resolves them itself. [`NerOptions::default`] is parsing no
/// flags (a test holds the two together).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct NerOptions {
    /// Folder with train.txt, valid.txt and test.txt (CoNLL-2003 format).
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", default_value = "assets/conll2003"))]
    pub data: PathBuf,
    /// Folder with config.json, model.safetensors and vocab.txt (HuggingFace layout).
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", default_value = "assets/minilm"))]
    pub model: PathBuf,
    /// Output folder: checkpoints (with predictions beside them) and summary.json.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", default_value = "runs/ner"))]
    pub out: PathBuf,
    /// Epochs.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3,
        value_parser = |s: &str| flags::at_least(s, 1, "--epochs", "")))]
    pub epochs: usize,
    /// Sentences per batch on each rank.
    #[cfg_attr(feature = "clap", arg(long, value_name = "PER_RANK", default_value_t = 32,
        value_parser = |s: &str| flags::at_least(s, 1, "--batch-size", "")))]
    pub batch_size: usize,
    /// Peak learning rate for one rank (scaled by --lr-scaling with the world size).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 5e-5, allow_negative_numbers = true,
        value_parser = |s: &str| flags::finite_at_least(s, 0.0, "--lr")))]
    pub lr: f64,
    /// How the learning rate grows with the world size: none, linear (Horovod) or sqrt.
    #[cfg_attr(feature = "clap", arg(long, default_value = "linear"))]
    pub lr_scaling: LrScaling,
    /// Fraction of the steps spent warming the learning rate up.
    #[cfg_attr(feature = "clap", arg(long = "warmup", value_name = "WARMUP", default_value_t = 0.1,
        allow_negative_numbers = true, value_parser = |s: &str| flags::fraction(s, "--warmup")))]
    pub warmup_fraction: f64,
    /// AdamW settings; the flag `--weight-decay` sets the decay, the others
    /// keep [`AdamWSettings::default`].
    #[cfg_attr(feature = "clap", arg(long = "weight-decay", value_name = "WEIGHT_DECAY",
        default_value = "0.01", allow_negative_numbers = true, value_parser = flags::weight_decay,
        help = "AdamW weight decay (not applied to biases and LayerNorm weights)"))]
    pub adamw: AdamWSettings,
    /// Clip the gradients' global norm to this (0: no clipping).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 1.0, allow_negative_numbers = true,
        value_parser = |s: &str| flags::finite_at_least(s, 0.0, "--clip-norm")))]
    pub clip_norm: f64,
    /// Truncate sentences to this many tokens.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 128,
        value_parser = |s: &str| flags::at_least(s, 3, "--max-len", "")))]
    pub max_len: usize,
    /// Lowercase before WordPiece (uncased models such as MiniLM); the flag
    /// `--cased` turns it off.
    #[cfg_attr(feature = "clap", arg(long = "cased", action = clap::ArgAction::SetFalse,
        help = "Keep the case of words (for cased models; MiniLM is uncased)"))]
    pub lowercase: bool,
    /// Mask each token with this probability as augmentation (0: none).
    #[cfg_attr(feature = "clap", arg(long, value_name = "P", default_value_t = 0.0,
        allow_negative_numbers = true, value_parser = |s: &str| flags::fraction(s, "--augment-mask")))]
    pub augment_mask: f64,
    /// How masks are seeded: derived (per sample, the default), per-worker, or
    /// naive (the bug: every rank and worker the same stream).
    #[cfg_attr(feature = "clap", arg(long, default_value = "derived"))]
    pub seeding: MaskSeeding,
    /// Base seed.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 42))]
    pub seed: u64,
    /// Compare ranks' masks and gradients every N steps (0: never). No flag of
    /// its own here: `drove train ner --diagnose-every` defaults to
    /// [`NerOptions::default_diagnose_every`], which only the joined world tells.
    #[cfg_attr(feature = "clap", arg(skip))]
    pub diagnose_every: usize,
    /// Write a Chrome trace-event timeline of every rank's steps here (rank 0
    /// writes it at the end; see [`drove_train::timeline`]).
    #[serde(default)]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_name = "FILE",
            help = "Write a Horovod-style timeline of every rank's steps to FILE (Chrome \
                trace-event JSON: open it in Perfetto or chrome://tracing) [env: DROVE_TIMELINE]"
        )
    )]
    pub timeline: Option<PathBuf>,
    /// What the diversity alarm does when a diagnosed step's masks are
    /// identical across ranks: warn (the default) or fail the run.
    #[serde(default)]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_name = "warn|fail",
            default_value = "warn",
            help = "What the diversity alarm does when a diagnosed step's masks are identical \
                across ranks: warn once, or fail the run at that step (exit code 3)"
        )
    )]
    pub on_identical_masks: MaskAlarm,
    /// The parameter whose local gradients --diagnose-every compares.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "NAME", default_value = "bert.layers.last.query.weight")
    )]
    pub diagnose_parameter: String,
    /// Train on the first N sentences only.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_train_sentences: Option<usize>,
    /// Evaluate on the first N sentences of each set only.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_eval_sentences: Option<usize>,
    /// Sets to evaluate after every epoch (comma-separated; empty for none).
    #[cfg_attr(
        feature = "clap",
        arg(long = "eval", value_name = "SETS", default_value = "valid,test", value_delimiter = ',')
    )]
    pub eval_sets: Vec<String>,
    /// Also checkpoint every N steps within an epoch (0: at epoch ends only).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 0))]
    pub checkpoint_every: usize,
    /// Loader threads per rank.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2,
        value_parser = |s: &str| flags::at_least(s, 1, "--workers", "")))]
    pub workers: usize,
    /// Sort windows of N batches by length to cut padding (0: off; default 16,
    /// and 0 in an elastic run, whose progress must stay a prefix of the
    /// epoch's order).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub bucket_window: Option<usize>,
    /// Split each rank's batch into N micro-batches run at once, one per
    /// thread, their gradients summed (0: one per thread of the rank).
    // Dropout masks do not depend on the split, so only the order of
    // floating-point sums does.
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 0))]
    pub micro_batches: usize,
    /// Wait for the whole backward pass before averaging any gradients,
    /// instead of all-reducing each bucket while backward goes on (the same
    /// parameters either way, bit for bit).
    #[serde(default)]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            help = "All-reduce the gradients after the whole backward pass instead of each bucket \
                while backward goes on (the same parameters either way)"
        )
    )]
    pub no_overlap: bool,
    /// All-reduce the word embedding's whole gradient instead of the rows the
    /// batch touched ([`drove_train::SparseRows`]: on one host the same
    /// parameters bit for bit; across hosts a tenth of the bytes for MiniLM).
    #[serde(default)]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            help = "All-reduce the word embedding's whole gradient instead of the rows the batch touched"
        )
    )]
    pub dense_embeddings: bool,
    /// Largest bucket of gradients one all-reduce carries, in MiB (Horovod's
    /// fusion threshold): smaller buckets start sooner during backward,
    /// larger ones pay less per message.
    #[serde(default = "default_bucket_mib")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "MiB", default_value_t = default_bucket_mib(),
        value_parser = |s: &str| flags::at_least(s, 1, "--bucket-mib", " MiB")))]
    pub bucket_mib: usize,
    /// Where parameters and optimizer state live (host buffers or backend
    /// tensors). No flag here: `drove train ner --placement` defaults to the
    /// device's own.
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(skip))]
    pub placement: Placement,
    /// Pad each batch's length up to a multiple of N, so that a GPU run
    /// compiles kernels for a few shapes once instead of one set per length
    /// (1: pad to the longest row only). No default here: the command takes
    /// the device's own ([`drove_device::DeviceChoice::pad_multiple`]).
    #[serde(default)]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_name = "N",
            value_parser = |s: &str| flags::at_least(s, 1, "--pad-multiple", ""),
            help = "Pad each batch's length up to a multiple of N: a GPU then compiles kernels for a few \
                shapes once, not for every length [default: 16 on a GPU, 1 on the CPU]"
        )
    )]
    pub pad_multiple: Option<usize>,
    /// How a GPU run averages its gradients: auto (NCCL in device memory,
    /// unless ranks share a GPU: then through the host), nccl, or host.
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(long, value_name = "auto|nccl|host", default_value = "auto"))]
    pub gradient_path: GradientPath,
    /// Where a GPU run keeps its compiled kernels and autotune results
    /// between runs: a folder, `default` ($DROVE_KERNEL_CACHE, else
    /// ~/.cache/drove/kernels), or `off`.
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR|default|off", default_value = "default"))]
    pub kernel_cache: KernelCache,
    /// Dropout for every layer, overriding config.json (0 for exact comparisons).
    #[cfg_attr(feature = "clap", arg(long, value_name = "P", allow_negative_numbers = true,
        value_parser = |s: &str| flags::fraction(s, "--dropout")))]
    pub dropout: Option<f64>,
    /// Continue from the latest checkpoint under --out.
    #[cfg_attr(feature = "clap", arg(long))]
    pub resume: bool,
    /// Stop after N steps in this process (the schedule still spans the whole run).
    #[cfg_attr(feature = "clap", arg(long, value_name = "N"))]
    pub max_steps: Option<u64>,
    /// Append every applied step's samples to FILE, one JSON line per rank
    /// and step: epoch, step, generation, world, rank and the (sample id,
    /// mask hash) of each real row (padding left out). Ranks append whole
    /// lines to the one file.
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    pub trace_samples: Option<PathBuf>,
    /// Elastic runs: ask whether the world should re-form (a member waits to
    /// join) every N steps (one small all-reduce).
    #[serde(default = "default_reform_check")]
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", default_value_t = 5,
        value_parser = |s: &str| flags::at_least(s, 1, "--reform-check-every", "")))]
    pub reform_check_every: usize,
    /// Start from random weights of `config.json`'s shape instead of
    /// `model.safetensors` (throughput where the weights are not at hand; no
    /// flag of `drove train ner`).
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(skip))]
    pub random_init: bool,
    /// How a step is computed on a GPU (each change of issue 49 on or off).
    #[serde(default)]
    #[cfg_attr(feature = "clap", command(flatten))]
    pub gpu_step: GpuStep,
}

/// The length-bucketing window of a fixed world when none is given.
pub const DEFAULT_BUCKET_WINDOW: usize = 16;

/// Steps between diagnostics where the diversity alarm is on by default
/// ([`NerOptions::default_diagnose_every`]).
pub const DEFAULT_DIAGNOSE_EVERY: usize = 50;

impl NerOptions {
    /// How often a world of `world_size` ranks diagnoses when no interval is
    /// given: every [`DEFAULT_DIAGNOSE_EVERY`] steps where the diversity alarm
    /// can go off (masking augmentation on, more than one rank to compare),
    /// else never (0). The alarm is on by default wherever it can tell
    /// something.
    pub fn default_diagnose_every(&self, world_size: usize) -> usize {
        if self.augment_mask > 0.0 && world_size > 1 { DEFAULT_DIAGNOSE_EVERY } else { 0 }
    }

    /// The length-bucketing window a world of this kind uses: the one given,
    /// else [`DEFAULT_BUCKET_WINDOW`] in a fixed world and none in an elastic
    /// one. Bucketing reorders a rank's batches, so an elastic run's progress
    /// would no longer be a prefix of the epoch's order to re-shard from: a
    /// window given to an elastic run is an error naming it.
    pub fn bucket_window_for(&self, elastic: bool) -> Result<usize, NerError> {
        match (self.bucket_window, elastic) {
            (Some(window), true) if window > 0 => Err(NerError::Options(format!(
                "an elastic run needs --bucket-window 0 (found {window}): length bucketing reorders a \
                 rank's batches, so the samples applied would not be a prefix of the epoch's order to \
                 re-shard from; leave the flag out and an elastic run buckets nothing"
            ))),
            (Some(window), _) => Ok(window),
            (None, true) => Ok(0),
            (None, false) => Ok(DEFAULT_BUCKET_WINDOW),
        }
    }
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
            no_overlap: false,
            dense_embeddings: false,
            bucket_mib: default_bucket_mib(),
            placement: Placement::Host,
            bucket_window: None,
            pad_multiple: None,
            gradient_path: GradientPath::Auto,
            kernel_cache: KernelCache::Default,
            dropout: None,
            resume: false,
            max_steps: None,
            trace_samples: None,
            reform_check_every: default_reform_check(),
            random_init: false,
            gpu_step: GpuStep::default(),
        }
    }
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

/// Settings no run can go on with (the flags' own parsers refuse them too,
/// but options may be built in code).
fn default_bucket_mib() -> usize {
    drove_collective::fusion::DEFAULT_FUSION_BYTES >> 20
}

fn default_reform_check() -> usize {
    5
}

pub(crate) fn check_options(opts: &NerOptions) -> Result<(), NerError> {
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
/// run, a summed loss the loop scales to the global batch's token mean
/// (`TokenMean`, in `token_mean.rs`), and at most one micro-batch per row.
pub(crate) fn replica_options(opts: &NerOptions, total_steps: u64) -> ReplicaOptions {
    ReplicaOptions {
        lr: opts.lr,
        lr_scaling: opts.lr_scaling,
        schedule: Schedule::warmup_linear(opts.warmup_fraction, total_steps),
        adamw: opts.adamw,
        clip_norm: opts.clip_norm,
        micro_batches: MicroBatches::resolve(opts.micro_batches, opts.batch_size),
        loss: LossReduction::Sum,
        placement: opts.placement,
        overlap: !opts.no_overlap,
        loss_read: opts.gpu_step.loss_read,
        sparse_rows: if opts.dense_embeddings { SparseRows::off() } else { SparseRows::default() },
        fusion: drove_collective::fusion::FusionOptions {
            threshold_bytes: opts.bucket_mib << 20,
            ..Default::default()
        },
        ..ReplicaOptions::default()
    }
}

#[cfg(all(test, feature = "clap"))]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct NerCommand {
        #[command(flatten)]
        options: NerOptions,
    }

    #[test]
    fn the_default_is_parsing_no_flags() {
        assert_eq!(NerCommand::parse_from(["ner"]).options, NerOptions::default());
    }

    #[test]
    fn flags_spelled_apart_from_their_fields_set_them() {
        let o = NerCommand::parse_from([
            "ner",
            "--cased",
            "--warmup",
            "0.2",
            "--weight-decay",
            "0",
            "--eval",
            "test",
        ])
        .options;
        assert!(!o.lowercase);
        assert_eq!(o.warmup_fraction, 0.2);
        assert_eq!(o.adamw, AdamWSettings { weight_decay: 0.0, ..AdamWSettings::default() });
        assert_eq!(o.eval_sets, ["test"]);
    }

    #[test]
    fn an_elastic_world_buckets_nothing_unless_told_and_refuses_a_window_it_cannot_keep() {
        let default = NerCommand::parse_from(["ner"]).options;
        assert_eq!(default.bucket_window_for(false).unwrap(), DEFAULT_BUCKET_WINDOW);
        assert_eq!(default.bucket_window_for(true).unwrap(), 0);
        let zero = NerCommand::parse_from(["ner", "--bucket-window", "0"]).options;
        assert_eq!((zero.bucket_window_for(false).unwrap(), zero.bucket_window_for(true).unwrap()), (0, 0));
        let eight = NerCommand::parse_from(["ner", "--bucket-window", "8"]).options;
        assert_eq!(eight.bucket_window_for(false).unwrap(), 8);
        let err = eight.bucket_window_for(true).unwrap_err().to_string();
        assert!(err.contains("--bucket-window 0 (found 8)"), "{err}");
    }

    #[test]
    fn the_alarm_is_on_by_default_only_where_it_can_go_off() {
        let masked = NerCommand::parse_from(["ner", "--augment-mask", "0.15"]).options;
        assert_eq!(masked.default_diagnose_every(2), DEFAULT_DIAGNOSE_EVERY);
        assert_eq!(masked.default_diagnose_every(1), 0, "one rank: nothing to compare");
        assert_eq!(NerOptions::default().default_diagnose_every(4), 0, "no masking: nothing to compare");
    }

    #[test]
    fn out_of_range_values_are_refused_naming_the_flag() {
        for (flag, value) in [("--epochs", "0"), ("--max-len", "2"), ("--warmup", "1.5"), ("--lr", "NaN")] {
            let err = NerCommand::try_parse_from(["ner", flag, value]).err().expect("refused").to_string();
            assert!(err.contains(flag), "{flag} {value}: {err}");
        }
    }
}

//! The scaling suite's rank: drove-ner's fine-tune on the ranks it was
//! launched with (`drove run`, or the environment `bench/scaling.sh` sets in
//! each network namespace), timed step by step, with the parts of a step a
//! scaling study needs: compute (forward and backward), the communication
//! left exposed after backward, the communication in all, and the optimizer.
//!
//! Every batch is padded to one length ([`ScalingOptions::pad_to`]), so that
//! every step does the same work on every rank and at every world size: a
//! step's time then changes with the world only through communication and
//! contention, which is what scaling efficiency is to show. Run once with
//! overlap and once without on the same link: the second's all-reduce is the
//! communication measured apart from backward, the bound the first is
//! judged against.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use drove_collective::{Collective, Element, ReduceOp, ReduceOptions};
use drove_ner::{NerOptions, Observer, StepReport, train_ner};
use drove_train::PhaseTimes;
use serde::Serialize;

use crate::BenchError;
use crate::error::Doing as _;

/// Settings of one scaling run (`drove bench scaling`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct ScalingOptions {
    /// Folder with the CoNLL-2003 files.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", default_value = "assets/conll2003"))]
    pub data: PathBuf,
    /// Folder with the model.
    #[cfg_attr(feature = "clap", arg(long, value_name = "DIR", default_value = "assets/minilm"))]
    pub model: PathBuf,
    /// Sentences per rank and step (the global batch grows with the ranks,
    /// as in weak scaling).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 8))]
    pub batch_size: usize,
    /// Steps timed, after --warmup-steps untimed ones.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 10))]
    pub steps: u64,
    /// Untimed steps first (the first overlapped pass measures where each
    /// gradient is finished and does not overlap).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 2))]
    pub warmup_steps: u64,
    /// Pad every batch to this many tokens (the longest sentence is cut to
    /// it), so that every step does the same work.
    #[cfg_attr(feature = "clap", arg(long, value_name = "TOKENS", default_value_t = 128))]
    pub pad_to: usize,
    /// All-reduce after the whole backward pass instead of overlapping it.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_overlap: bool,
    /// All-reduce the word embedding's whole gradient, not its touched rows.
    #[cfg_attr(feature = "clap", arg(long))]
    pub dense_embeddings: bool,
    /// Largest gradient bucket, in MiB (`drove train ner --bucket-mib`'s default).
    #[cfg_attr(feature = "clap", arg(long, value_name = "MiB", default_value_t = drove_collective::fusion::DEFAULT_FUSION_BYTES >> 20))]
    pub bucket_mib: usize,
    /// Start from random weights of the model's shape (config.json only).
    #[cfg_attr(feature = "clap", arg(long))]
    pub random_init: bool,
}

impl Default for ScalingOptions {
    fn default() -> Self {
        ScalingOptions {
            data: "assets/conll2003".into(),
            model: "assets/minilm".into(),
            batch_size: 8,
            steps: 10,
            warmup_steps: 2,
            pad_to: 128,
            no_overlap: false,
            dense_embeddings: false,
            bucket_mib: drove_collective::fusion::DEFAULT_FUSION_BYTES >> 20,
            random_init: false,
        }
    }
}

/// Mean seconds per timed step of each part (keys in the order of their names).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StepParts {
    /// Optimizer: the global norm and clipping, and the update.
    pub optimizer: f64,
    /// The engine's all-reduce time in all, most of it during backward (0
    /// without overlap: then it is all exposed).
    pub communication: f64,
    /// Forward and backward passes.
    pub compute: f64,
    /// The slowest rank's forward and backward passes that step: what a
    /// synchronous step waits for at least, where ranks share cores.
    pub slowest_compute: f64,
    /// The all-reduce left after backward ended: what the step waited for.
    pub exposed_communication: f64,
    /// The wall time between two steps' ends, batch preparation included.
    pub step: f64,
}

/// What one scaling run reports (rank 0's view; every rank waits for the
/// same all-reduces, so the step times agree across ranks).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingReport {
    /// Sentences per rank and step.
    pub batch_size: usize,
    /// `scaling`.
    pub benchmark: &'static str,
    /// Largest gradient bucket, MiB.
    pub bucket_mib: usize,
    /// Whether the word embedding's gradient went as its touched rows.
    pub sparse_embeddings: bool,
    /// Whether the all-reduce overlapped backward (asked for and possible:
    /// never at one rank).
    pub overlap: bool,
    /// Tokens every row is padded to.
    pub pad_to: usize,
    /// Mean seconds per timed step of each part.
    pub parts: StepParts,
    /// The same parts, step by step (timed steps only).
    pub per_step: Vec<StepParts>,
    /// Sentences per second across every rank: the global batch over the
    /// mean step.
    pub sentences_per_s: f64,
    /// Steps timed.
    pub steps_timed: usize,
    /// rayon's threads (`RAYON_NUM_THREADS`, else the CPUs).
    pub threads: usize,
    /// Ranks.
    pub world_size: usize,
}

/// Records each step's parts as it ends.
struct Steps {
    last: Instant,
    parts: Vec<StepParts>,
}

impl Observer for Steps {
    fn step(&mut self, r: &StepReport) {
        let now = Instant::now();
        let wall = now.duration_since(self.last);
        self.last = now;
        self.parts.push(parts(&r.phases, wall));
    }
}

fn parts(p: &PhaseTimes, wall: Duration) -> StepParts {
    StepParts {
        optimizer: (p.clip + p.update).as_secs_f64(),
        communication: p.communication.as_secs_f64(),
        compute: p.compute.as_secs_f64(),
        // This rank's until the ranks compare (`run`).
        slowest_compute: p.compute.as_secs_f64(),
        exposed_communication: p.all_reduce.as_secs_f64(),
        step: wall.as_secs_f64(),
    }
}

fn mean(steps: &[StepParts], f: fn(&StepParts) -> f64) -> f64 {
    steps.iter().map(f).sum::<f64>() / steps.len().max(1) as f64
}

/// Trains `o.warmup_steps + o.steps` steps on `comm`'s ranks (on the CPU,
/// without evaluation, output in a scratch folder) and reports the timed
/// ones. Every rank returns the report; a caller prints rank 0's.
pub fn run(o: &ScalingOptions, comm: &dyn Collective) -> Result<ScalingReport, BenchError> {
    let out = tempfile::tempdir().doing("creating a scratch folder")?;
    let opts = NerOptions {
        data: o.data.clone(),
        model: o.model.clone(),
        out: out.path().to_path_buf(),
        // Enough epochs for the steps, whatever the batch; --max-steps stops it.
        epochs: (o.warmup_steps + o.steps).max(1) as usize,
        batch_size: o.batch_size,
        max_len: o.pad_to,
        pad_multiple: Some(o.pad_to),
        eval_sets: Vec::new(),
        bucket_window: Some(0),
        micro_batches: 1,
        no_overlap: o.no_overlap,
        dense_embeddings: o.dense_embeddings,
        bucket_mib: o.bucket_mib,
        max_steps: Some(o.warmup_steps + o.steps),
        random_init: o.random_init,
        ..NerOptions::default()
    };
    let mut steps = Steps { last: Instant::now(), parts: Vec::new() };
    train_ner::<Autodiff<Flex>>(&opts, comm, &mut steps, &Default::default()).map_err(BenchError::Ner)?;
    let skip = (o.warmup_steps as usize).min(steps.parts.len());
    let mut timed = steps.parts[skip..].to_vec();
    let world = comm.world_size();
    let mut slowest: Vec<f64> = timed.iter().map(|p| p.compute).collect();
    if world > 1 && !slowest.is_empty() {
        let max = ReduceOptions::new(ReduceOp::Max);
        comm.all_reduce("scaling.slowest_compute", &[slowest.len()], f64::tensor_mut(&mut slowest), max)?;
    }
    timed.iter_mut().zip(slowest).for_each(|(p, s)| p.slowest_compute = s);
    let parts = StepParts {
        optimizer: mean(&timed, |p| p.optimizer),
        communication: mean(&timed, |p| p.communication),
        compute: mean(&timed, |p| p.compute),
        slowest_compute: mean(&timed, |p| p.slowest_compute),
        exposed_communication: mean(&timed, |p| p.exposed_communication),
        step: mean(&timed, |p| p.step),
    };
    Ok(ScalingReport {
        batch_size: o.batch_size,
        benchmark: "scaling",
        bucket_mib: o.bucket_mib,
        sparse_embeddings: !o.dense_embeddings,
        overlap: timed.iter().any(|p| p.communication > 0.0),
        pad_to: o.pad_to,
        sentences_per_s: if parts.step > 0.0 { (o.batch_size * world) as f64 / parts.step } else { 0.0 },
        parts,
        steps_timed: timed.len(),
        per_step: timed,
        threads: std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|t| t.parse::<usize>().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        world_size: world,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use drove_collective::LocalWorld;

    use super::*;

    /// A small CoNLL training set, a vocabulary and a tiny BERT config (random weights).
    fn write_tiny(data: &Path, model: &Path) {
        let words = ["john", "lives", "in", "paris", "mary", "visits", "london"];
        let mut train = String::from("-DOCSTART- -X- -X- O\n\n");
        for i in 0..24 {
            let (a, b) = if i % 2 == 0 { ("john", "paris") } else { ("mary", "london") };
            train += &format!("{a} NNP B-NP B-PER\nlives VBZ B-VP O\nin IN B-PP O\n{b} NNP B-NP B-LOC\n\n");
        }
        std::fs::write(data.join("train.txt"), train).unwrap();
        let vocab: Vec<&str> =
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].iter().chain(&words).copied().collect();
        std::fs::write(model.join("vocab.txt"), vocab.join("\n") + "\n").unwrap();
        let config = serde_json::json!({
            "vocab_size": vocab.len(), "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
        });
        std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    }

    /// Two ranks on threads: the report's parts as the step says, with and
    /// without overlap.
    #[test]
    fn two_ranks_report_their_steps_parts_with_and_without_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let (data, model) = (dir.path().join("data"), dir.path().join("model"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&model).unwrap();
        write_tiny(&data, &model);
        for no_overlap in [false, true] {
            let o = ScalingOptions {
                data: data.clone(),
                model: model.clone(),
                batch_size: 4,
                steps: 3,
                warmup_steps: 2,
                pad_to: 16,
                no_overlap,
                random_init: true,
                ..ScalingOptions::default()
            };
            let o = &o;
            let reports: Vec<ScalingReport> = std::thread::scope(|s| {
                let ranks: Vec<_> = LocalWorld::new(2)
                    .unwrap()
                    .into_iter()
                    .map(|comm| s.spawn(move || run(o, &comm)))
                    .collect();
                ranks.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
            });
            for r in &reports {
                assert_eq!((r.world_size, r.steps_timed, r.per_step.len()), (2, 3, 3));
                assert_eq!(r.overlap, !no_overlap, "{r:?}");
                assert!(r.parts.compute > 0.0 && r.parts.step >= r.parts.compute, "{r:?}");
                assert!(r.parts.slowest_compute >= r.parts.compute, "{r:?}");
                assert_eq!(r.parts.communication > 0.0, !no_overlap, "{r:?}");
                assert!((r.sentences_per_s - 8.0 / r.parts.step).abs() < 1e-9, "{r:?}");
            }
            for (a, b) in reports[0].per_step.iter().zip(&reports[1].per_step) {
                assert_eq!(a.slowest_compute, b.slowest_compute, "the same on both ranks");
                assert_eq!(a.slowest_compute, a.compute.max(b.compute), "the slower rank's");
            }
        }
    }

    #[cfg(feature = "clap")]
    #[test]
    fn no_flags_are_the_default_options() {
        assert_eq!(crate::flags::parsed_from_no_flags::<ScalingOptions>(), ScalingOptions::default());
    }
}

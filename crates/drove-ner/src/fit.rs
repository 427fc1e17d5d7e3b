//! The fit loop: [`train_ner`] sets a run up, and [`Fit`] is one rank's run as
//! it goes (its steps, the epochs' ends, the checkpoints, a resume); an
//! elastic run's re-forms are in `fit/elastic.rs`.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use drove_bert::BertForTokenClassification;
use drove_collate::{Batch, Loader};
use drove_collective::{Collective, Elastic, Element, ReduceOptions};
use drove_device::BucketAllReduce;
use drove_diagnostic::Verdict;
use drove_seed::{DropoutKey, StreamKey};
use drove_train::checkpoint::{self, LoopState};
use drove_train::timeline::{Timeline, Traced, Track};
use drove_train::{Replica, ReplicaOptions};

use crate::data::{BatchRows, NerData, batch_tensors, training_loader};
use crate::diagnose::{diagnose, diagnosed_parameter};
use crate::eval::evaluate;
use crate::model::{load_encoder, loss};
use crate::options::{check_options, replica_options};
use crate::prewarm::prewarm_as_asked;
use crate::summary::{StepScale, Totals};
use crate::token_mean::TokenMean;
use crate::trace::{SampleTrace, TraceLine, mask_hash};
use crate::{EvalReport, MaskAlarm, NerError, NerOptions, NerSummary, Observer, StepReport};

mod elastic;

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
/// `reducer` (NCCL on GPUs: `drove_device::cuda::NcclBuckets`, feature `nccl`);
/// `None` keeps host staging.
pub fn train_ner_with<B: AutodiffBackend>(
    opts: &NerOptions,
    comm: &dyn Collective,
    observer: &mut dyn Observer,
    device: &B::Device,
    reducer: Option<Box<dyn BucketAllReduce<B::InnerBackend>>>,
) -> Result<NerSummary, NerError> {
    fit_ner::<B>(opts, comm, None, observer, device, reducer)
}

/// [`train_ner`] in an elastic run: when a member is lost (or one asks to
/// join) the world re-forms, every member keeps its model, optimizer state
/// and data in memory, takes the state of the most advanced member
/// ([`Replica::resync`]) and goes on with the rest of the epoch shared over
/// the new world; only the step whose all-reduce failed is redone.
///
/// The per-rank batch stays, so the global batch follows the world size, and
/// the learning rate follows it by `opts.lr_scaling` (`--lr-scaling none`
/// keeps it fixed). The schedule's length is counted at the smallest world
/// the run allows, so it never runs out early; a world above it ends the run
/// before the rate has decayed to zero. Length bucketing is off unless asked
/// for, and refused when asked for: it reorders a rank's batches, and an
/// elastic run's progress must be a prefix of the epoch's order
/// ([`NerOptions::bucket_window_for`]).
pub fn train_ner_elastic<B: AutodiffBackend>(
    opts: &NerOptions,
    comm: &dyn Elastic,
    observer: &mut dyn Observer,
    device: &B::Device,
) -> Result<NerSummary, NerError> {
    fit_ner::<B>(opts, comm, Some(comm), observer, device, None)
}

fn fit_ner<B: AutodiffBackend>(
    opts: &NerOptions,
    comm: &dyn Collective,
    elastic: Option<&dyn Elastic>,
    observer: &mut dyn Observer,
    device: &B::Device,
    reducer: Option<Box<dyn BucketAllReduce<B::InnerBackend>>>,
) -> Result<NerSummary, NerError> {
    let (rank, world) = (comm.rank(), comm.world_size());
    check_options(opts)?;
    drove_bert::set_dropout_masks(opts.gpu_step.masks());
    // Before the data is read and tokenized: a bad --max-len is named at once.
    crate::model::read_config(opts)?;
    let opts =
        &NerOptions { bucket_window: Some(opts.bucket_window_for(elastic.is_some())?), ..opts.clone() };
    let data = NerData::load(opts)?;
    observer.note(&format!(
        "rank {rank}/{world}: {} training sentences, {} labels, evaluation sets {:?}",
        data.train.len(),
        data.labels.len(),
        opts.eval_sets
    ));
    let model = load_encoder::<B>(opts, data.labels.len(), device)?;
    let layers = model.bert.layers.len();
    let loader = training_loader(opts, &data, rank, world, 0)?;
    let steps_per_epoch = loader.plan(0).len();
    // An elastic run's schedule spans the most steps it may take: at its smallest world.
    let total_steps = match elastic {
        None => (steps_per_epoch * opts.epochs) as u64,
        Some(e) => (data.train.len().div_ceil(e.range().min().get() * opts.batch_size) * opts.epochs) as u64,
    };
    let timeline = if opts.timeline.is_some() { Timeline::on() } else { Timeline::off() };
    let traced = Traced { inner: comm, timeline: &timeline };
    let comm: &dyn Collective = if timeline.is_on() { &traced } else { comm };
    let names = drove_train::flat::parameter_names(&model);
    let diagnosed = diagnosed_parameter(opts, &names, layers, world, observer)?;
    // The diagnosed parameter's local gradient is kept past an overlapped pass.
    let keep_local_gradient = diagnosed.map(|index| names[index].clone());
    let options = ReplicaOptions { keep_local_gradient, ..replica_options(opts, total_steps) };
    let mut replica = match elastic {
        // Members may be joining a world that trains: one resync brings all to one state.
        Some(_) => Replica::joining(model, comm, options, device)?,
        None => Replica::new(model, comm, options, device)?,
    }
    .with_timeline(&timeline);
    if let Some(reducer) = reducer {
        replica = replica.with_bucket_all_reduce(reducer)?;
    }
    if let Some(done) = prewarm_as_asked(opts, &data.train, replica.model(), device) {
        observer.note(&format!("rank {rank}: {done}"));
    }
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
        state: fresh_state(opts, world, data.train.len()),
        evaluations: Vec::new(),
        totals: Totals::new(world, opts.augment_mask),
        last_checkpoint: None,
        timeline: &timeline,
        elastic,
        trace: opts.trace_samples.as_deref().map(SampleTrace::open).transpose()?,
        loader_start: 0,
    };
    if opts.resume {
        fit.resume()?;
    }
    match elastic {
        Some(elastic) => {
            drop(loader);
            fit.join_world(elastic)?;
            fit.observer.started(fit.state.global_step, total_steps);
            fit.run_elastic(elastic)?;
        }
        None => {
            fit.observer.started(fit.state.global_step, total_steps);
            fit.run(&loader)?;
        }
    }
    // An elastic run ends in the world it has then.
    let world = fit.replica.comm().world_size();
    let summary = fit.totals.summary(world, fit.state.global_step, fit.evaluations, fit.last_checkpoint);
    write_outputs(opts, comm, &timeline, &summary)?;
    Ok(summary)
}

/// The loop's position at the start of a run, with the run's shape (which a
/// checkpoint resumed from must share).
fn fresh_state(opts: &NerOptions, world: usize, train_sentences: usize) -> LoopState {
    LoopState {
        position: 0,
        epoch: 0,
        batch: 0,
        global_step: 0,
        world_size: world,
        batch_size: opts.batch_size,
        seed: opts.seed,
        train_sentences,
        history: Vec::new(),
    }
}

/// The timeline, merged from every rank (all take part), and on rank 0
/// `OUT/summary.json`.
fn write_outputs(
    opts: &NerOptions,
    comm: &dyn Collective,
    timeline: &Timeline,
    summary: &NerSummary,
) -> Result<(), NerError> {
    if let Some(path) = &opts.timeline {
        timeline
            .write_merged(comm, path)
            .map_err(|e| NerError::Output { path: path.clone(), message: e.to_string() })?;
    }
    if comm.rank() == 0 {
        std::fs::create_dir_all(&opts.out)
            .map_err(|e| NerError::Output { path: opts.out.clone(), message: e.to_string() })?;
        let path = opts.out.join("summary.json");
        std::fs::write(&path, serde_json::to_vec_pretty(summary).expect("a summary serialises"))
            .map_err(|e| NerError::Output { path, message: e.to_string() })?;
    }
    Ok(())
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
    /// The elastic run's membership, when the run is elastic.
    elastic: Option<&'a dyn Elastic>,
    /// `--trace-samples`.
    trace: Option<SampleTrace>,
    /// The position of the epoch's order the current loader starts at.
    loader_start: usize,
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
        // An elastic run resumes at any world size: its progress is a position.
        let world = if self.elastic.is_some() { fresh.world_size } else { s.world_size };
        for (what, theirs, ours) in [
            ("world size", world as u64, fresh.world_size as u64),
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

    /// The epochs from where the loop stands, each ending in its evaluations
    /// and a checkpoint, until the last one or `max_steps` in this process.
    fn run(&mut self, loader: &Loader) -> Result<(), NerError> {
        let (opts, timeline) = (self.opts, self.timeline);
        let mut steps_here = 0u64;
        'epochs: while self.state.epoch < opts.epochs {
            let mut batches = loader.epoch(self.state.epoch as u64).enumerate();
            loop {
                let waited = Instant::now();
                let Some((b, batch)) = batches.next() else { break };
                let batch = batch?;
                if b < self.state.batch {
                    continue; // done before the checkpoint we resumed from
                }
                if opts.max_steps.is_some_and(|m| steps_here >= m) {
                    break 'epochs;
                }
                timeline.record("data wait", "phase", Track::Main, waited);
                self.step(b, &batch)?;
                timeline.record(format!("step {}", self.state.global_step), "step", Track::Main, waited);
                steps_here += 1;
            }
            if self.state.batch < self.steps_per_epoch {
                break; // stopped by max_steps
            }
            self.end_epoch()?;
        }
        Ok(())
    }

    /// One optimizer step on batch `b` of the epoch.
    fn step(&mut self, b: usize, batch: &Batch) -> Result<(), NerError> {
        let opts = self.opts;
        let world = self.replica.comm().world_size();
        let t0 = Instant::now();
        let step = self.state.global_step + 1;
        let local_labelled = batch.labels.iter().filter(|&&y| y >= 0).count();
        let counts = self.global_counts(local_labelled, batch)?;
        let token_mean = TokenMean::new(world, counts[0]);
        let diagnosed = self.diagnosed.filter(|_| step.is_multiple_of(opts.diagnose_every as u64));
        self.backward(batch, step, token_mean.scale())?;
        if let Some(index) = diagnosed {
            self.diagnose_step(index, batch, step)?;
        }
        let outcome = self.replica.apply()?;
        self.state.global_step = step;
        self.state.batch = b + 1;
        let applied = self.loader_start + (b + 1) * world * opts.batch_size;
        self.state.position = applied.min(self.data.train.len());
        self.trace_step(b, batch)?;

        let dt = t0.elapsed().as_secs_f64();
        self.totals.add(dt, (batch.batch_size * world) as u64, counts[1] as u64);
        self.totals.step_scales.push(StepScale {
            step,
            global_loss: outcome.global_loss.unwrap_or(f64::NAN),
            grad_norm: outcome.grad_norm.unwrap_or(f64::NAN),
        });
        // The loss is scaled for the global batch: this rank's mean is reported.
        self.observer.step(&StepReport {
            step,
            total_steps: self.total_steps,
            epoch: self.state.epoch + 1,
            loss: token_mean.local_mean(outcome.local_loss, local_labelled),
            lr: outcome.lr.unwrap_or(0.0),
            grad_norm: outcome.grad_norm.unwrap_or(0.0),
            sentences_per_s: (batch.batch_size * world) as f64 / dt,
            tokens_per_s: counts[1] / dt,
            phases: outcome.times,
            world_size: world,
            generation: self.elastic.map_or(0, |e| e.world().generation),
        });
        if opts.checkpoint_every > 0
            && step.is_multiple_of(opts.checkpoint_every as u64)
            && self.state.batch < self.steps_per_epoch
        {
            self.checkpoint(&[])?;
        }
        Ok(())
    }

    /// `--trace-samples`: batch `b`'s real rows (those whose position in the
    /// epoch's order is below its length) with their mask hashes.
    fn trace_step(&mut self, b: usize, batch: &Batch) -> Result<(), NerError> {
        let Some(trace) = self.trace.as_mut() else { return Ok(()) };
        let comm = self.replica.comm();
        let (rank, world, rows) = (comm.rank(), comm.world_size(), self.opts.batch_size);
        let len = self.data.train.len();
        let samples = (0..batch.batch_size)
            .filter(|&j| self.loader_start + (b * rows + j) * world + rank < len)
            .map(|j| (batch.indices[j], mask_hash(batch, j)))
            .collect();
        trace.record(&TraceLine {
            epoch: self.state.epoch,
            step: self.state.global_step,
            generation: self.elastic.map_or(0, |e| e.world().generation),
            world,
            rank,
            samples,
        })
    }

    /// The labelled tokens (`local_labelled` here) and the real tokens of the
    /// global batch: this rank's counts summed over ranks.
    fn global_counts(&self, local_labelled: usize, batch: &Batch) -> Result<[f64; 2], NerError> {
        let comm = self.replica.comm();
        let mut counts = [local_labelled as f64, batch.real_tokens() as f64];
        self.timeline.span("counts all-reduce", "phase", Track::Main, || {
            comm.all_reduce("step.counts", &[2], f64::tensor_mut(&mut counts), ReduceOptions::sum())
        })?;
        Ok(counts)
    }

    /// Forward and backward of this rank's batch (its micro-batches at once),
    /// the summed token loss multiplied by `scale` ([`TokenMean::scale`]); the
    /// gradients wait in the replica.
    fn backward(&mut self, batch: &Batch, step: u64, scale: f64) -> Result<(), NerError> {
        let (opts, device) = (self.opts, self.device);
        let rank = self.replica.comm().rank();
        // Dropout draws from this rank's stream for this step.
        let dropout_seed =
            StreamKey::dropout(DropoutKey { seed: opts.seed, rank: rank as u32, step }).derive().words()[0];
        let num_labels = self.data.labels.len();
        let computed = Instant::now();
        // The loss stays where the placement keeps it: it comes with apply.
        self.replica.pass(&BatchRows(batch), |model, micro| {
            drove_bert::seed_dropout_rows(dropout_seed, micro.rows.start);
            let part = micro.batch.0.rows(micro.rows.clone());
            let (ids, types, mask) = batch_tensors::<B>(&part, device);
            loss(model.forward(ids, types, mask), &part.labels, num_labels, scale, device)
        })?;
        self.timeline.record("forward+backward", "phase", Track::Main, computed);
        Ok(())
    }

    /// The diagnostic at a diagnosed step (parameter `index`), and the
    /// diversity alarm at the first one whose masks are not independent; with
    /// `--on-identical-masks fail` identical masks stop every rank here.
    fn diagnose_step(&mut self, index: usize, batch: &Batch, step: u64) -> Result<(), NerError> {
        let diagnosed = Instant::now();
        let comm = self.replica.comm();
        let gradient = self.replica.local_gradient(index)?;
        let report = diagnose(comm, batch, &gradient, step, &mut self.totals.agreement)?;
        self.totals.cosines.push(report.grad_cosine);
        self.observer.diagnosed(&report);
        // Every rank computes the same report, so all raise (and stop) together.
        if report.masks.is_alarm() && self.totals.alarm.is_none() {
            let message = format!("step {step}: {}", report.masks.explain());
            self.totals.alarm = Some(message.clone());
            self.observer.alarm(&report);
            if self.opts.on_identical_masks == MaskAlarm::Fail && report.masks.verdict == Verdict::Identical {
                // Rank 0 has recorded the alarm (its observer did): all stop together.
                comm.barrier("diversity alarm")?;
                return Err(NerError::IdenticalMasks { step, message });
            }
        }
        self.timeline.record("diagnostic", "phase", Track::Main, diagnosed);
        Ok(())
    }

    /// The end of an epoch: every evaluation set, then a checkpoint with the
    /// predictions beside it.
    fn end_epoch(&mut self) -> Result<(), NerError> {
        // The loop's position moves on only once the evaluations are done, so
        // that a world re-formed during them does them again.
        let epoch = self.state.epoch + 1;
        let inference = self.replica.model().valid();
        let mut extra = Vec::new();
        for set in &self.data.eval {
            let evaluated = Instant::now();
            let (report, predictions) = evaluate::<B::InnerBackend>(
                &inference,
                set,
                &self.data.labels,
                self.replica.comm(),
                epoch,
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
        (self.state.epoch, self.state.batch, self.state.position) = (epoch, 0, 0);
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

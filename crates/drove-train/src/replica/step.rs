//! The step of a [`Replica`]: the backward passes of this rank's batch
//! ([`Replica::backward`]), and when they are due the update
//! ([`Replica::apply`]): the loss all-reduce, the placement's gradient
//! all-reduce, clipping and AdamW, and the error of a step that is not finite.

use std::ops::Range;
use std::time::Instant;

use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use drove_collective::{Buffer, Element, Gathered, ReduceOptions};

use super::overlapped::Weigh;
use super::{Micro, Replica, Rows, StepOutcome, split_rows};
use crate::TrainError;
use crate::error::NoLocalGradient;
use crate::micro::fresh_leaves;
use crate::overlap::PassKind;
use crate::overlap::graph::Probes;
use crate::phase::PhaseTimes;
use crate::placement::{Gradients, Reset, UpdateSettings};
use crate::timeline::Track;

impl<'c, B: AutodiffBackend, M: AutodiffModule<B>> Replica<'c, B, M> {
    /// One backward pass over this rank's `batch` and, every
    /// `backward_passes_per_step` calls, the update: gradients averaged across
    /// ranks, clipped, and applied by AdamW. Every rank calls it as often.
    ///
    /// `loss(model, micro)` returns the loss of the rows `micro.rows` of
    /// `micro.batch`, as [`ReplicaOptions::loss`](super::ReplicaOptions::loss) says; it runs once per
    /// micro-batch, at once on several threads.
    pub fn step<T, F>(&mut self, batch: &T, loss: F) -> Result<StepOutcome, TrainError>
    where
        T: Rows + ?Sized,
        F: Fn(&M, &Micro<'_, T>) -> Tensor<B, 1> + Sync,
    {
        self.pass(batch, loss)?;
        if self.passes < self.options.backward_passes_per_step {
            let local = self.loss_so_far();
            return Ok(StepOutcome {
                applied: false,
                step: self.steps(),
                passes: self.passes,
                local_loss: local,
                global_loss: None,
                grad_norm: None,
                lr: None,
                times: PhaseTimes { compute: self.compute, ..PhaseTimes::default() },
            });
        }
        self.apply()
    }

    /// One backward pass: the micro-batches' gradients are added to those
    /// accumulated since the last update. Returns this rank's loss over the
    /// step so far (a blocking read where the loss is kept on the device,
    /// [`LossRead::AtUpdate`](crate::LossRead::AtUpdate)). [`step`](Self::step) is this followed, when due, by
    /// [`apply`](Self::apply).
    pub fn backward<T, F>(&mut self, batch: &T, loss: F) -> Result<f64, TrainError>
    where
        T: Rows + ?Sized,
        F: Fn(&M, &Micro<'_, T>) -> Tensor<B, 1> + Sync,
    {
        self.pass(batch, loss)?;
        Ok(self.loss_so_far())
    }

    /// This rank's loss over the step's passes so far, the part kept on the
    /// device read back (and kept on the host from then on).
    fn loss_so_far(&mut self) -> f64 {
        if let Some((passes, losses)) = self.take_deferred_loss() {
            let values = crate::flat::to_f32(drove_kernels::transfer::read(losses), 0).unwrap_or_default();
            self.add_losses(&passes, &values);
        }
        self.local_loss
    }

    /// The losses kept on the device, end to end in one tensor, and how many
    /// each pass has; `None` when there are none.
    fn take_deferred_loss(&mut self) -> Option<(Vec<usize>, Tensor<B::InnerBackend, 1>)> {
        let passes = std::mem::take(&mut self.deferred_loss);
        let counts = passes.iter().map(Vec::len).collect();
        let all: Vec<_> = passes.into_iter().flatten().collect();
        (!all.is_empty()).then(|| (counts, Tensor::cat(all, 0)))
    }

    /// Adds read-back losses to this rank's loss, pass by pass as the host
    /// adds its own (each pass's micro-batches summed from 0, then added);
    /// a missing value is NaN.
    fn add_losses(&mut self, passes: &[usize], values: &[f32]) {
        let mut values = values.iter().map(|&v| f64::from(v));
        for &count in passes {
            let mut total = 0.0;
            for _ in 0..count {
                total += values.next().unwrap_or(f64::NAN);
            }
            self.local_loss += total;
        }
    }

    /// Whether this step's losses stay on the device until the update.
    fn defers_loss(&self) -> bool {
        self.options.loss_read == crate::LossRead::AtUpdate
            && self.options.placement == crate::Placement::Backend
    }

    /// [`backward`](Self::backward) without reading the loss back: where the
    /// placement keeps it on the device ([`LossRead::AtUpdate`](crate::LossRead::AtUpdate)), it arrives
    /// with [`apply`](Self::apply)'s outcome, read together with the gradient
    /// norm. A trainer that looks at the loss only after the update calls
    /// this, then `apply`.
    pub fn pass<T, F>(&mut self, batch: &T, loss: F) -> Result<(), TrainError>
    where
        T: Rows + ?Sized,
        F: Fn(&M, &Micro<'_, T>) -> Tensor<B, 1> + Sync,
    {
        let started = Instant::now();
        let rows = batch.rows();
        if rows == 0 {
            return Err(TrainError::EmptyBatch);
        }
        if matches!(self.pending, Some(Gradients::Averaged(_))) {
            let (pass, passes) = (self.passes + 1, self.options.backward_passes_per_step);
            return Err(TrainError::StepComplete { pass, passes });
        }
        let last = self.passes + 1 == self.options.backward_passes_per_step;
        let kind = self.overlap.kind(self.overlap_wanted(), last);
        // A last pass that measures goes through the engine too (without
        // hooks), so that every rank issues the same collectives in the same
        // order whether it has measured yet or not (a member joining an
        // elastic run measures when the others overlap already).
        if kind == PassKind::Overlapped || (kind == PassKind::Measure && last) {
            let exposed_before = self.exposed;
            let (total, averaged) = self.backward_overlapped(batch, &loss, kind == PassKind::Measure)?;
            self.pending = Some(Gradients::Averaged(averaged));
            self.passes += 1;
            self.local_loss += total;
            // The wait for the engine after backward is the exposed all-reduce, not compute.
            self.compute += started.elapsed().saturating_sub(self.exposed - exposed_before);
            return Ok(());
        }
        let measure = kind == PassKind::Measure;
        let model = self.model();
        let jobs: Vec<_> = split_rows(rows, self.micro.count())
            .into_iter()
            .map(|range| (range, fresh_leaves(model.clone())))
            .collect();
        let measured = std::sync::Mutex::new(Vec::new());
        let weigh = self.weigh(rows);
        let timeline = self.timeline;
        let defer = self.defers_loss();
        // Each micro-batch's loss on the device, where it is not read now.
        let kept = std::sync::Mutex::new(Vec::new());
        let pass = |index: usize, range: Range<usize>, model: &M| {
            let value = weigh.loss(batch, &loss, index, range, model, timeline);
            let scalar = if defer {
                kept.lock().unwrap_or_else(|e| e.into_inner()).push((index, value.clone().inner()));
                0.0
            } else {
                drove_kernels::transfer::read_scalar(value.clone())
            };
            let backward = Instant::now();
            let probes = measure.then(|| Probes::new(model));
            let root = match &probes {
                Some(probes) => probes.root(value),
                None => value,
            };
            let grads = GradientsParams::from_grads(root.backward(), model);
            if let Some(probes) = probes {
                measured.lock().unwrap_or_else(|e| e.into_inner()).push((index, probes.seen()));
            }
            timeline.record("backward", "micro", Track::Micro(index), backward);
            (scalar, grads)
        };
        let total = self.placement.backward(&self.micro, jobs, &pass)?;
        self.pending = Some(Gradients::Local);
        if measure {
            let mut measured = measured.into_inner().unwrap_or_else(|e| e.into_inner());
            measured.sort_by_key(|(index, _)| *index);
            self.overlap.learn(measured.into_iter().map(|(_, levels)| levels).collect(), &self.device);
        }
        let mut kept = kept.into_inner().unwrap_or_else(|e| e.into_inner());
        if defer {
            kept.sort_by_key(|(index, _)| *index);
            self.deferred_loss.push(kept.into_iter().map(|(_, value)| value).collect());
        }
        self.passes += 1;
        self.local_loss += total;
        self.compute += started.elapsed();
        Ok(())
    }

    /// How a micro-batch's loss is weighed in a step of `rows` rows.
    pub(super) fn weigh(&self, rows: usize) -> Weigh {
        Weigh { rows, passes: self.options.backward_passes_per_step as f64, reduction: self.options.loss }
    }

    /// This rank's accumulated gradient of parameter `index` (module order),
    /// before the all-reduce: for diagnostics such as the gradient cosine
    /// between ranks.
    pub fn local_gradient(&self, index: usize) -> Result<Vec<f32>, TrainError> {
        if let Some((kept, values)) = &self.overlap.local
            && *kept == index
        {
            return Ok(values.clone());
        }
        let why = match self.pending {
            None => NoLocalGradient::NoPass,
            Some(Gradients::Averaged(_)) => NoLocalGradient::Averaged,
            Some(Gradients::Local) => match self.placement.local_gradient(index) {
                Some(gradient) => return gradient,
                None => NoLocalGradient::NoParameter,
            },
        };
        Err(TrainError::NoLocalGradient { index, why })
    }

    /// The update of the passes accumulated so far: gradients averaged across
    /// ranks, clipped by their global norm, and applied by AdamW. Every rank
    /// calls it at the same step.
    pub fn apply(&mut self) -> Result<StepOutcome, TrainError> {
        let Some(grads) = self.pending.take() else {
            return Err(TrainError::NoBackward);
        };
        let clip = self.options.clip_norm;
        let lr = self.next_lr();
        let mut times = PhaseTimes {
            compute: std::mem::take(&mut self.compute),
            all_reduce: std::mem::take(&mut self.exposed),
            communication: std::mem::take(&mut self.communication),
            ..PhaseTimes::default()
        };
        self.overlap.local = None;
        let mut local_loss = std::mem::take(&mut self.local_loss);
        let passes = std::mem::take(&mut self.passes);
        let step = self.steps() + 1;
        // Alone, a loss kept on the device guards the update there and is
        // read with the gradient norm; in a larger world it is read now.
        let alone = self.comm.world_size() == 1 && local_loss.is_finite();
        let guard = match self.take_deferred_loss() {
            Some(deferred) if alone => Some(deferred),
            Some((passes, losses)) => {
                self.local_loss = local_loss;
                let values =
                    crate::flat::to_f32(drove_kernels::transfer::read(losses), 0).inspect_err(|_| {
                        // The step ends here: its gradients go with it.
                        self.placement.reset(Reset::Gradients);
                    })?;
                self.add_losses(&passes, &values);
                local_loss = std::mem::take(&mut self.local_loss);
                None
            }
            None => None,
        };
        // The loss first: a rank whose loss is not finite stops every rank
        // before any update, so the parameters stay those of the last step.
        let checked = match guard {
            Some(_) => None,
            None => Some(self.finite_global_loss(step, local_loss)?),
        };
        let settings = UpdateSettings { all_reduce: &self.all_reduce, clip, lr, timeline: self.timeline };
        let model = self.model.take().expect("the model is always put back");
        let (passes_kept, guard) = guard.unzip();
        let (model, updated) = self.placement.update(model, grads, &settings, &mut times, guard);
        self.model = Some(model);
        let updated = updated?;
        // Where the loss guarded the update, the device refused it when the
        // loss or the norm was not finite: the same errors, after the read.
        if let (Some(passes), Some(losses)) = (passes_kept, &updated.loss) {
            self.local_loss = local_loss;
            self.add_losses(&passes, losses);
            local_loss = std::mem::take(&mut self.local_loss);
            if !local_loss.is_finite() {
                return Err(self.non_finite(step, "loss", local_loss, local_loss));
            }
        }
        let (global_loss, grad_norm) = (checked.unwrap_or(local_loss), updated.grad_norm);
        if !grad_norm.is_finite() {
            return Err(self.non_finite(step, "global gradient norm", grad_norm, local_loss));
        }
        Ok(StepOutcome {
            applied: true,
            step: self.steps(),
            passes,
            local_loss,
            global_loss: Some(global_loss),
            grad_norm: Some(grad_norm),
            lr: Some(lr),
            times,
        })
    }

    /// The mean of the ranks' local losses, or the error that stops every
    /// rank before any update when it is not finite.
    fn finite_global_loss(&mut self, step: u64, local_loss: f64) -> Result<f64, TrainError> {
        match self.global_loss(local_loss) {
            Ok(loss) if loss.is_finite() => Ok(loss),
            other => {
                self.overlap.local = None;
                self.placement.reset(Reset::Gradients);
                let loss = other?;
                Err(self.non_finite(step, "loss", loss, local_loss))
            }
        }
    }

    /// The mean of the ranks' local losses (one scalar all-reduce).
    fn global_loss(&self, local_loss: f64) -> Result<f64, TrainError> {
        if self.comm.world_size() == 1 {
            return Ok(local_loss);
        }
        let mut value = [local_loss];
        let started = Instant::now();
        let reduced =
            self.comm.all_reduce("step.loss", &[1], f64::tensor_mut(&mut value), ReduceOptions::average());
        self.timeline.record("loss all-reduce", "phase", Track::Main, started);
        reduced?;
        Ok(value[0])
    }

    /// The error of a step whose loss or gradient norm is not finite, naming
    /// the ranks whose local loss was not (every rank gathers them, so all fail
    /// with the same message).
    fn non_finite(&self, step: u64, what: &'static str, value: f64, local_loss: f64) -> TrainError {
        let ranks = if self.comm.world_size() > 1 {
            match self.comm.all_gather("step.nonfinite", &[1], f64::tensor_ref(&[local_loss])) {
                Ok(Gathered { data: Buffer::F64(losses), .. }) => {
                    losses.iter().enumerate().filter(|(_, l)| !l.is_finite()).map(|(r, _)| r).collect()
                }
                Ok(_) => Vec::new(),
                Err(e) => return e.into(),
            }
        } else if local_loss.is_finite() {
            Vec::new()
        } else {
            vec![0]
        };
        TrainError::NonFinite { step, what, value, ranks }
    }
}

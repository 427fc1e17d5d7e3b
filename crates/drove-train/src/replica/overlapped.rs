//! The overlapped backward pass of a [`Replica`]: each micro-batch's model
//! carries hooks that hand every finished gradient to the engine, which
//! all-reduces each bucket while backward goes on (see [`crate::overlap`]);
//! the pass ends when backward has and the engine has reduced what was left.

use std::ops::Range;
use std::sync::mpsc::{Sender, channel};
use std::time::Instant;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::{LossReduction, Micro, Replica, Rows, split_rows};
use crate::micro::fresh_leaves;
use crate::overlap::engine::{self, Arrival, EngineRun};
use crate::overlap::graph::{Probes, hooked, supported};
use crate::timeline::{Timeline, Track};
use crate::{Placement, TrainError};

/// How a micro-batch's loss is weighed: by its share of the step's rows on
/// this rank (mean losses) or as it is (sums).
#[derive(Clone, Copy)]
pub(super) struct Weigh {
    pub rows: usize,
    pub passes: f64,
    pub reduction: LossReduction,
}

impl Weigh {
    /// The forward pass of micro-batch `index` (rows `range`) on `model`:
    /// its weighed loss, the tensor to run backward from (not read back).
    pub(super) fn loss<B, M, T, F>(
        &self,
        batch: &T,
        loss: &F,
        index: usize,
        range: Range<usize>,
        model: &M,
        timeline: &Timeline,
    ) -> Tensor<B, 1>
    where
        B: AutodiffBackend,
        T: Rows + ?Sized,
        F: Fn(&M, &Micro<'_, T>) -> Tensor<B, 1>,
    {
        let weight = match self.reduction {
            LossReduction::Mean => range.len() as f64 / self.rows as f64 / self.passes,
            LossReduction::Sum => 1.0,
        };
        let micro = Micro { batch, rows: range, index, weight };
        let forward = Instant::now();
        let mut value = loss(model, &micro);
        if self.reduction == LossReduction::Mean {
            value = value.mul_scalar(weight);
        }
        timeline.record("forward", "micro", Track::Micro(index), forward);
        value
    }
}

/// Sends `Done` (or `Failed`, if the micro-batch's thread is unwinding) when
/// dropped, so the engine never waits for a micro-batch that is gone.
struct Finish {
    tx: Sender<Arrival>,
    micro: usize,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let micro = self.micro;
        let _ = self.tx.send(if std::thread::panicking() {
            Arrival::Failed { micro }
        } else {
            Arrival::Done { micro }
        });
    }
}

impl<'c, B: AutodiffBackend, M: AutodiffModule<B>> Replica<'c, B, M> {
    /// Whether this replica's passes overlap: asked for, more than one rank,
    /// burn's `Autodiff` backend, and gradients the host collective may
    /// average (host buffers, or host staging's).
    pub(super) fn overlap_wanted(&self) -> bool {
        self.options.overlap
            && self.comm.world_size() > 1
            && supported::<B>()
            && (self.options.placement == Placement::Host || self.all_reduce.device_may_overlap())
    }

    /// Whether the replica's backward passes overlap the all-reduce (after
    /// the first, which measures where each gradient is finished), and how
    /// many parameters are hooked: `(false, 0)` where overlap is off or
    /// cannot work (see [`crate::overlap`]).
    pub fn overlapping(&self) -> (bool, usize) {
        (self.overlap_wanted(), self.overlap.hooked())
    }

    /// The last pass of a step, overlapped: returns the sum of the
    /// micro-batches' losses and the averaged gradients (host buffers, module
    /// order) for the update.
    /// A pass that `measure`s has no hooks (every gradient reaches the
    /// engine after backward) and probes that learn where the hooks go.
    pub(super) fn backward_overlapped<T, F>(
        &mut self,
        batch: &T,
        loss: &F,
        measure: bool,
    ) -> Result<(f64, Vec<Vec<f32>>), TrainError>
    where
        T: Rows + ?Sized,
        F: Fn(&M, &Micro<'_, T>) -> Tensor<B, 1> + Sync,
    {
        let rows = batch.rows();
        let weigh = self.weigh(rows);
        let timeline = self.timeline;
        let sizes: Vec<usize> = self.shapes.iter().map(|s| s.iter().product()).collect();
        let pending = self.placement.take_host()?;
        let keep_local = self.overlap.keep_local;
        let hooks = if measure { None } else { self.overlap.hooks() };
        let levels = hooks.map_or(&[][..], |(levels, _)| levels);
        let (tx, inbox) = channel();
        let model = self.model.as_ref().expect("the model is always put back");
        let jobs: Vec<_> = split_rows(rows, self.micro.count())
            .into_iter()
            .enumerate()
            .map(|(i, range)| match hooks {
                Some((levels, ticks)) => (range, hooked(model.clone(), levels, ticks, &tx, i)),
                None => (range, fresh_leaves(model.clone())),
            })
            .collect();
        let measured = std::sync::Mutex::new(Vec::new());
        let (buckets, names) = (self.all_reduce.host(), self.names.as_slice());
        let micros = jobs.len();
        let plan = EngineRun { buckets, sizes, levels, names, micros, pending, keep_local, timeline };
        let micro = &self.micro;
        let work = |index: usize, (range, model): (Range<usize>, M)| {
            let finish = Finish { tx: tx.clone(), micro: index };
            let value = weigh.loss(batch, loss, index, range, &model, timeline);
            let scalar = drove_kernels::transfer::read_scalar(value.clone());
            let backward = Instant::now();
            let _ = finish.tx.send(Arrival::Backward { micro: index, at: backward });
            let probes = measure.then(|| Probes::new(&model));
            let root = match &probes {
                Some(probes) => probes.root(value),
                None => value,
            };
            let mut grads = GradientsParams::from_grads(root.backward(), &model);
            if let Some(probes) = probes {
                measured.lock().unwrap_or_else(|e| e.into_inner()).push((index, probes.seen()));
            }
            timeline.record("backward", "micro", Track::Micro(index), backward);
            send_unhooked(&model, &mut grads, levels, &finish);
            drop(finish);
            scalar
        };
        let (losses, reduced, exposed) = std::thread::scope(|scope| {
            let engine = scope.spawn(move || engine::run(plan, inbox));
            let losses = micro.run(jobs, work);
            let ended = Instant::now();
            let reduced = engine.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            timeline.record("exposed all-reduce", "overlap", Track::Main, ended);
            (losses, reduced, ended.elapsed())
        });
        drop(tx);
        let reduced = reduced?;
        if measure {
            let mut measured = measured.into_inner().unwrap_or_else(|e| e.into_inner());
            measured.sort_by_key(|(index, _)| *index);
            self.overlap.learn(measured.into_iter().map(|(_, seen)| seen).collect(), &self.device);
        }
        self.overlap.local = reduced.local;
        self.exposed += exposed;
        self.communication += reduced.communication;
        Ok((losses.into_iter().sum(), reduced.grads))
    }
}

/// Sends the gradients backward left in `grads` (those of the parameters
/// without a hook) to the engine, as micro-batch `finish.micro`'s.
fn send_unhooked<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    levels: &[Option<usize>],
    finish: &Finish,
) {
    struct Send<'a, 'b> {
        grads: &'a mut GradientsParams,
        levels: &'a [Option<usize>],
        finish: &'b Finish,
        index: usize,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Send<'_, '_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let param_index = self.index;
            self.index += 1;
            if self.levels.get(param_index).copied().flatten().is_some() {
                return;
            }
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                let values = crate::flat::to_f32(drove_kernels::transfer::read(g), param_index);
                let micro = self.finish.micro;
                let _ = self.finish.tx.send(Arrival::Gradient {
                    param: param_index,
                    micro,
                    values,
                    sent: Instant::now(),
                });
            }
        }
    }
    model.visit(&mut Send { grads, levels, finish, index: 0 });
}

//! The host placement: parameters, gradients and AdamW state as flat `f32`
//! buffers in host memory (the CPU fast path). Gradients leave their tensors
//! on the micro-batches' threads, are summed and averaged as buffers through
//! the replica's [`GradientAllReduce`](crate::gradients::GradientAllReduce)
//! (buckets, and row-sparse tables as their rows), clipped and applied on
//! rayon's threads, then written back into the model.

use std::borrow::Cow;
use std::ops::Range;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::step::{Gradients, Pass, PlacementStep, Reset, UpdateSettings, Updated, accumulate};
use crate::TrainError;
use crate::flat::{FlatAdamW, FlatParams, clip_global_norm, global_norm, take_gradients};
use crate::gradients::StepGradients;
use crate::micro::{MicroBatches, add_into};
use crate::phase::{PhaseTimes, phase};

/// [`FlatParams`] and [`FlatAdamW`], and the gradients summed since the last
/// update as flat buffers in module order.
pub(crate) struct HostPlacement<B: AutodiffBackend> {
    params: FlatParams,
    optim: FlatAdamW,
    device: B::Device,
    pending: Option<Vec<Vec<f32>>>,
}

impl<B: AutodiffBackend> HostPlacement<B> {
    pub(crate) fn new(params: FlatParams, optim: FlatAdamW, device: &B::Device) -> Self {
        HostPlacement { params, optim, device: device.clone(), pending: None }
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> PlacementStep<B, M> for HostPlacement<B> {
    fn backward(
        &mut self,
        micro: &MicroBatches,
        jobs: Vec<(Range<usize>, M)>,
        pass: &Pass<'_, M>,
    ) -> Result<f64, TrainError> {
        let add = |sum: &mut Vec<Vec<f32>>, more: Vec<Vec<f32>>| add_into(sum, &more);
        accumulate(micro, jobs, pass, |model, grads| take_gradients(model, grads), add, &mut self.pending)
    }

    fn take_host(&mut self) -> Result<Option<Vec<Vec<f32>>>, TrainError> {
        Ok(self.pending.take())
    }

    fn local_gradient(&self, index: usize) -> Option<Result<Vec<f32>, TrainError>> {
        self.pending.as_ref()?.get(index).cloned().map(Ok)
    }

    fn update(
        &mut self,
        model: M,
        grads: Gradients,
        u: &UpdateSettings<'_, '_, B::InnerBackend>,
        times: &mut PhaseTimes,
        loss: Option<Tensor<B::InnerBackend, 1>>,
    ) -> (M, Result<Updated, TrainError>) {
        let pending = self.pending.take();
        let (mut flat, averaged) = match (grads, pending) {
            (Gradients::Averaged(grads), _) => (grads, true),
            (Gradients::Local, Some(grads)) => (grads, false),
            (Gradients::Local, None) => return (model, Err(TrainError::NoBackward)),
        };
        // On the host a guard is read first: a loss that is not finite leaves
        // everything as it was.
        let loss = match loss.map(|l| crate::flat::to_f32(drove_kernels::transfer::read(l), 0)).transpose() {
            Ok(loss) => loss,
            Err(e) => return (model, Err(e)),
        };
        if loss.as_ref().is_some_and(|l| !l.iter().all(|v| v.is_finite())) {
            return (model, Ok(Updated { grad_norm: f64::NAN, loss }));
        }
        let reduced = phase(u.timeline, "gradient all-reduce", &mut times.all_reduce, || {
            if averaged { Ok(()) } else { u.all_reduce.average(StepGradients::Host(&mut flat)) }
        });
        if let Err(e) = reduced {
            return (model, Err(e));
        }
        let norm = phase(u.timeline, "clip", &mut times.clip, || {
            if u.clip > 0.0 { clip_global_norm(&mut flat, u.clip) } else { global_norm(&flat) }
        });
        if !norm.is_finite() {
            // Every rank has this norm (of the averaged gradients): none updates.
            return (model, Ok(Updated { grad_norm: norm, loss }));
        }
        let model = phase(u.timeline, "optimizer", &mut times.update, || {
            self.optim.update(&mut self.params, &flat, u.lr);
            self.params.write(model, &self.device)
        });
        (model, Ok(Updated { grad_norm: norm, loss }))
    }

    fn steps(&self) -> u64 {
        self.optim.step
    }

    fn host_state(&self, _model: &M) -> Result<(Cow<'_, FlatParams>, Cow<'_, FlatAdamW>), TrainError> {
        Ok((Cow::Borrowed(&self.params), Cow::Borrowed(&self.optim)))
    }

    fn reset(&mut self, to: Reset) {
        self.pending = None;
        if let Reset::State(params, optim) = to {
            (self.params, self.optim) = (params, optim);
        }
    }
}

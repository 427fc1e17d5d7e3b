//! The backend placement: parameters, gradients and AdamW state as tensors
//! on the backend's device (the GPU path). Gradients are summed with tensor
//! adds and averaged through the replica's
//! [`GradientAllReduce`](crate::gradients::GradientAllReduce) (drove-device's
//! seam: host staging unless replaced); clipping and [`DeviceAdamW`] run in
//! burn ops. The parts are in [`crate::device`].

use std::borrow::Cow;
use std::ops::Range;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::step::{Gradients, Pass, PlacementStep, Reset, UpdateSettings, Updated, accumulate};
use crate::TrainError;

use crate::device::{DeviceAdamW, clip_global_norm, flatten, take_gradients};
use crate::flat::{FlatAdamW, FlatParams};
use crate::gradients::StepGradients;
use crate::micro::MicroBatches;
use crate::phase::{PhaseTimes, phase};

/// [`DeviceAdamW`] and the gradients summed since the last update as flat
/// 1-D tensors in module order.
pub(crate) struct BackendPlacement<B: AutodiffBackend> {
    optim: DeviceAdamW<B::InnerBackend>,
    device: B::Device,
    pending: Option<Vec<Tensor<B::InnerBackend, 1>>>,
}

impl<B: AutodiffBackend> BackendPlacement<B> {
    pub(crate) fn new(optim: DeviceAdamW<B::InnerBackend>, device: &B::Device) -> Self {
        BackendPlacement { optim, device: device.clone(), pending: None }
    }

    /// Averaged host buffers as tensors on the device.
    fn upload(&self, grads: Vec<Vec<f32>>) -> Vec<Tensor<B::InnerBackend, 1>> {
        grads
            .into_iter()
            .map(|g| {
                let n = g.len();
                drove_kernels::transfer::upload(burn::tensor::TensorData::new(g, [n]), &self.device)
            })
            .collect()
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> PlacementStep<B, M> for BackendPlacement<B> {
    fn backward(
        &mut self,
        micro: &MicroBatches,
        jobs: Vec<(Range<usize>, M)>,
        pass: &Pass<'_, M>,
    ) -> Result<f64, TrainError> {
        let device = &self.device;
        let take = |model: &M, grads: &mut _| Ok(take_gradients(model, grads, device));
        let add = |sum: &mut Vec<Tensor<B::InnerBackend, 1>>, more: Vec<Tensor<B::InnerBackend, 1>>| {
            for (x, y) in sum.iter_mut().zip(more) {
                *x = x.clone() + y;
            }
        };
        accumulate(micro, jobs, pass, take, add, &mut self.pending)
    }

    fn take_host(&mut self) -> Result<Option<Vec<Vec<f32>>>, TrainError> {
        let Some(pending) = self.pending.take() else { return Ok(None) };
        let host = pending
            .into_iter()
            .enumerate()
            .map(|(index, grad)| crate::flat::to_f32(drove_kernels::transfer::read(grad), index))
            .collect::<Result<_, _>>()?;
        Ok(Some(host))
    }

    fn local_gradient(&self, index: usize) -> Option<Result<Vec<f32>, TrainError>> {
        let grad = self.pending.as_ref()?.get(index)?;
        Some(crate::flat::to_f32(drove_kernels::transfer::read(grad.clone()), index))
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
        let (mut tensors, averaged) = match (grads, pending) {
            (Gradients::Averaged(grads), _) => (self.upload(grads), true),
            (Gradients::Local, Some(tensors)) => (tensors, false),
            (Gradients::Local, None) => return (model, Err(TrainError::NoBackward)),
        };
        let reduced = phase(u.timeline, "gradient all-reduce", &mut times.all_reduce, || {
            if averaged { Ok(()) } else { u.all_reduce.average(StepGradients::Device(&mut tensors)) }
        });
        if let Err(e) = reduced {
            return (model, Err(e));
        }
        if tensors.is_empty() {
            let loss = loss.map(|l| crate::flat::to_f32(drove_kernels::transfer::read(l), 0)).transpose();
            return (model, loss.map(|loss| Updated { grad_norm: 0.0, loss }));
        }
        // Queued on the device without a host decision; the norm (and the
        // loss that guards the update, if given) is read back once the update
        // is queued too: the step's one blocking read.
        let (grads, norm) =
            phase(u.timeline, "clip", &mut times.clip, || clip_global_norm(flatten(&tensors), u.clip));
        // The update is guarded on the device by the norm (the same on every
        // rank) and the loss where given: the values the step reads.
        let guarded = loss.as_ref().map(|l| l.shape().num_elements());
        let guard = match loss {
            Some(loss) => Tensor::cat(vec![loss, norm], 0),
            None => norm,
        };
        phase(u.timeline, "optimizer", &mut times.update, || {
            let model = self.optim.update(model, grads, u.lr, Some(guard.clone()));
            let read = crate::flat::to_f32(drove_kernels::transfer::read(guard), 0).map(|mut values| {
                if !values.iter().all(|v| v.is_finite()) {
                    self.optim.refused();
                }
                let grad_norm = values.pop().map_or(f64::NAN, f64::from);
                Updated { grad_norm, loss: guarded.map(|_| values) }
            });
            (model, read)
        })
    }

    fn steps(&self) -> u64 {
        self.optim.step
    }

    fn host_state(&self, model: &M) -> Result<(Cow<'_, FlatParams>, Cow<'_, FlatAdamW>), TrainError> {
        // Host copies of the device tensors, for the file.
        Ok((Cow::Owned(FlatParams::read(model)?), Cow::Owned(self.optim.to_flat()?)))
    }

    fn reset(&mut self, to: Reset) {
        self.pending = None;
        if let Reset::State(_params, optim) = to {
            self.optim.load_flat(&optim, &self.device);
        }
    }
}

//! The backend placement: parameters, gradients and AdamW state as tensors
//! on the backend's device (the GPU path). Gradients are summed with tensor
//! adds and averaged bucket by bucket through a [`BucketAllReduce`] (host
//! staging unless replaced); clipping and [`DeviceAdamW`] run in burn ops.
//! The parts are in [`crate::device`].

use std::borrow::Cow;
use std::ops::Range;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::step::{Pass, PlacementStep, UpdateSettings, accumulate};
use crate::TrainError;
use drove_device::BucketAllReduce;

use crate::device::{DeviceAdamW, all_reduce_planned, clip_global_norm, flatten, scalar, take_gradients};
use crate::flat::{FlatAdamW, FlatParams};
use crate::micro::MicroBatches;
use crate::phase::{PhaseTimes, phase};

/// [`DeviceAdamW`], the bucket all-reduce, and the gradients summed since the
/// last update as flat 1-D tensors in module order.
pub(crate) struct BackendPlacement<B: AutodiffBackend> {
    optim: DeviceAdamW<B::InnerBackend>,
    reducer: Box<dyn BucketAllReduce<B::InnerBackend>>,
    device: B::Device,
    pending: Option<Vec<Tensor<B::InnerBackend, 1>>>,
    /// Whether `pending` is averaged across ranks already.
    reduced: bool,
}

impl<B: AutodiffBackend> BackendPlacement<B> {
    pub(crate) fn new(
        optim: DeviceAdamW<B::InnerBackend>,
        reducer: Box<dyn BucketAllReduce<B::InnerBackend>>,
        device: &B::Device,
    ) -> Self {
        BackendPlacement { optim, reducer, device: device.clone(), pending: None, reduced: false }
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

    fn has_gradients(&self) -> bool {
        self.pending.is_some()
    }

    fn discard_gradients(&mut self) {
        (self.pending, self.reduced) = (None, false);
    }

    fn overlappable(&self) -> bool {
        self.reducer.host_staging().is_some()
    }

    fn take_pending_host(&mut self) -> Result<Option<Vec<Vec<f32>>>, TrainError> {
        let Some(pending) = self.pending.take() else { return Ok(None) };
        let host = pending
            .into_iter()
            .enumerate()
            .map(|(index, grad)| crate::flat::to_f32(drove_kernels::transfer::read(grad), index))
            .collect::<Result<_, _>>()?;
        Ok(Some(host))
    }

    fn set_reduced(&mut self, grads: Vec<Vec<f32>>) -> Result<(), TrainError> {
        let device = &self.device;
        let tensors = grads
            .into_iter()
            .map(|g| {
                let n = g.len();
                drove_kernels::transfer::upload::<B::InnerBackend, 1, _>(burn::tensor::TensorData::new(g, [n]), device)
            })
            .collect();
        (self.pending, self.reduced) = (Some(tensors), true);
        Ok(())
    }

    fn is_reduced(&self) -> bool {
        self.reduced
    }

    fn local_gradient(&self, index: usize) -> Option<Result<Vec<f32>, TrainError>> {
        let grad = self.pending.as_ref()?.get(index)?;
        Some(crate::flat::to_f32(drove_kernels::transfer::read(grad.clone()), index))
    }

    fn update(
        &mut self,
        model: M,
        u: &UpdateSettings<'_>,
        times: &mut PhaseTimes,
    ) -> (M, Result<f64, TrainError>) {
        let Some(mut tensors) = self.pending.take() else {
            return (model, Err(TrainError::Options("apply needs a backward pass first".into())));
        };
        let averaged = std::mem::take(&mut self.reduced);
        let reduced = phase(u.timeline, "gradient all-reduce", &mut times.all_reduce, || {
            if averaged {
                return Ok(());
            }
            all_reduce_planned(self.reducer.as_ref(), u.comm, &mut tensors, u.fusion, u.plan)
        });
        if let Err(e) = reduced {
            return (model, Err(e));
        }
        if tensors.is_empty() {
            return (model, Ok(0.0));
        }
        // Queued on the device without a host decision; the norm is read
        // back once the update is queued too (the step's one sync).
        let (grads, norm) =
            phase(u.timeline, "clip", &mut times.clip, || clip_global_norm(flatten(&tensors), u.clip));
        let (model, norm) = phase(u.timeline, "optimizer", &mut times.update, || {
            let model = self.optim.update(model, grads, u.lr);
            (model, scalar(norm))
        });
        (model, Ok(norm))
    }

    fn steps(&self) -> u64 {
        self.optim.step
    }

    fn host_state(&self, model: &M) -> Result<(Cow<'_, FlatParams>, Cow<'_, FlatAdamW>), TrainError> {
        // Host copies of the device tensors, for the file.
        Ok((Cow::Owned(FlatParams::read(model)?), Cow::Owned(self.optim.to_flat()?)))
    }

    fn restore(&mut self, _params: FlatParams, optim: FlatAdamW) {
        self.optim.load_flat(&optim, &self.device);
        (self.pending, self.reduced) = (None, false);
    }

    fn set_bucket_all_reduce(
        &mut self,
        reducer: Box<dyn BucketAllReduce<B::InnerBackend>>,
    ) -> Result<(), TrainError> {
        self.reducer = reducer;
        Ok(())
    }
}

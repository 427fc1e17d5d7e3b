//! The host placement: parameters, gradients and AdamW state as flat `f32`
//! buffers in host memory (the CPU fast path). Gradients leave their tensors
//! on the micro-batches' threads, are summed and all-reduced as buffers
//! (`all_reduce_planned`: buckets, and row-sparse tables as their rows), clipped and applied on rayon's threads, then written
//! back into the model.

use std::borrow::Cow;
use std::ops::Range;

use burn::module::AutodiffModule;
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use drove_collective::ReduceOptions;
use drove_collective::fusion::all_reduce_planned;

use super::step::{Pass, PlacementStep, UpdateSettings, Updated, accumulate};
use crate::TrainError;
use crate::flat::{FlatAdamW, FlatParams, clip_global_norm, global_norm, take_gradients};
use crate::micro::{MicroBatches, add_into};
use crate::phase::{PhaseTimes, phase};
use drove_device::BucketAllReduce;

/// [`FlatParams`] and [`FlatAdamW`], and the gradients summed since the last
/// update as flat buffers in module order.
pub(crate) struct HostPlacement<B: AutodiffBackend> {
    params: FlatParams,
    optim: FlatAdamW,
    device: B::Device,
    pending: Option<Vec<Vec<f32>>>,
    /// Whether `pending` is averaged across ranks already.
    reduced: bool,
}

impl<B: AutodiffBackend> HostPlacement<B> {
    pub(crate) fn new(params: FlatParams, optim: FlatAdamW, device: &B::Device) -> Self {
        HostPlacement { params, optim, device: device.clone(), pending: None, reduced: false }
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

    fn has_gradients(&self) -> bool {
        self.pending.is_some()
    }

    fn discard_gradients(&mut self) {
        (self.pending, self.reduced) = (None, false);
    }

    fn overlappable(&self) -> bool {
        true
    }

    fn take_pending_host(&mut self) -> Result<Option<Vec<Vec<f32>>>, TrainError> {
        Ok(self.pending.take())
    }

    fn set_reduced(&mut self, grads: Vec<Vec<f32>>) -> Result<(), TrainError> {
        (self.pending, self.reduced) = (Some(grads), true);
        Ok(())
    }

    fn is_reduced(&self) -> bool {
        self.reduced
    }

    fn local_gradient(&self, index: usize) -> Option<Result<Vec<f32>, TrainError>> {
        self.pending.as_ref()?.get(index).cloned().map(Ok)
    }

    fn update(
        &mut self,
        model: M,
        u: &UpdateSettings<'_>,
        times: &mut PhaseTimes,
        loss: Option<Tensor<B::InnerBackend, 1>>,
    ) -> (M, Result<Updated, TrainError>) {
        let Some(mut flat) = self.pending.take() else {
            return (model, Err(TrainError::Options("apply needs a backward pass first".into())));
        };
        // On the host a guard is read first: a loss that is not finite leaves
        // everything as it was.
        let loss = match loss.map(|l| crate::flat::to_f32(drove_kernels::transfer::read(l), 0)).transpose() {
            Ok(loss) => loss,
            Err(e) => return (model, Err(e)),
        };
        if loss.as_ref().is_some_and(|l| !l.iter().all(|v| v.is_finite())) {
            self.reduced = false;
            return (model, Ok(Updated { grad_norm: f64::NAN, loss }));
        }
        let averaged = std::mem::take(&mut self.reduced);
        let reduced = phase(u.timeline, "gradient all-reduce", &mut times.all_reduce, || {
            if averaged {
                return Ok(());
            }
            let mut refs: Vec<&mut [f32]> = flat.iter_mut().map(|v| v.as_mut_slice()).collect();
            let compression = u.fusion.compression;
            all_reduce_planned(u.comm, "gradients", &mut refs, u.plan, ReduceOptions::average(), compression)
        });
        if let Err(e) = reduced {
            return (model, Err(e.into()));
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

    fn restore(&mut self, params: FlatParams, optim: FlatAdamW) {
        (self.params, self.optim, self.pending, self.reduced) = (params, optim, None, false);
    }

    fn set_bucket_all_reduce(
        &mut self,
        _reducer: Box<dyn BucketAllReduce<B::InnerBackend>>,
    ) -> Result<(), TrainError> {
        Err(TrainError::Options(
            "a bucket all-reduce replaces host staging of the backend placement only".into(),
        ))
    }
}

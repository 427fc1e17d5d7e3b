//! [`GradientAllReduce`]: the one door through which a replica averages a
//! step's gradients across ranks, whichever placement holds them.
//!
//! It owns what every path needs: the collective, the buckets (drove-collective's
//! [`Plan`]: runs of consecutive gradients, each row-sparse table alone, the
//! same on every rank), the wire format, and the device seam
//! ([`BucketAllReduce`]: host staging unless replaced, e.g. by NCCL). A step
//! starts its all-reduce by [`GradientAllReduce::average`], with host buffers
//! (the host placement) or tensors on the device (the backend placement);
//! beneath it, [`HostBuckets::average_bucket`] reduces one bucket of host
//! buffers, the call both the host path and the overlapped pass's engine
//! make, so their values are the same bit for bit.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use drove_collective::fusion::{Compression, Plan, all_reduce_one};
use drove_collective::{Collective, ReduceOptions};
use drove_device::{BucketAllReduce, HostStaging, bucket_name};

use crate::TrainError;

/// The op names of a step's gradient buckets: `gradients.bucket{b}`.
const NAME: &str = "gradients";

/// A step's gradients where their placement holds them, module order.
pub(crate) enum StepGradients<'a, I: Backend> {
    /// Flat host buffers (the host placement).
    Host(&'a mut [Vec<f32>]),
    /// Flat 1-D tensors on the device (the backend placement).
    Device(&'a mut [Tensor<I, 1>]),
}

/// How gradients on the device are averaged.
enum DeviceReduce<I: Backend> {
    /// Host staging, as the replica set it up: the same buckets the host
    /// collective reduces, so an overlapped pass may reduce them instead.
    Staged(HostStaging),
    /// A reducer the user gave ([`crate::Replica::with_bucket_all_reduce`]).
    Given(Box<dyn BucketAllReduce<I>>),
}

/// The one door of a step's gradient all-reduce; see the [module](self).
pub(crate) struct GradientAllReduce<'c, I: Backend> {
    host: HostBuckets<'c>,
    device: DeviceReduce<I>,
}

/// The buckets of a step's gradients held as host buffers, and the
/// collective that averages them: what the overlapped pass's engine thread
/// reduces through.
pub(crate) struct HostBuckets<'c> {
    comm: &'c dyn Collective,
    plan: Plan,
    compression: Compression,
}

impl<'c, I: Backend> GradientAllReduce<'c, I> {
    /// Averages through `comm` in the buckets of `plan`, dense buckets on the
    /// wire as `compression` says; gradients on the device by host staging.
    pub(crate) fn new(comm: &'c dyn Collective, plan: Plan, compression: Compression) -> Self {
        let host = HostBuckets { comm, plan, compression };
        GradientAllReduce { host, device: DeviceReduce::Staged(HostStaging { compression }) }
    }

    /// Averages gradients on the device through `reducer` from now on.
    pub(crate) fn set_device(&mut self, reducer: Box<dyn BucketAllReduce<I>>) {
        self.device = DeviceReduce::Given(reducer);
    }

    /// The buckets of host buffers, for the overlapped pass's engine.
    pub(crate) fn host(&self) -> &HostBuckets<'c> {
        &self.host
    }

    /// Whether gradients on the device may be averaged by the host
    /// collective bucket by bucket as backward finishes them (an overlapped
    /// pass) instead: where host staging, set up here, would average the same
    /// buckets anyway. Host buffers always may.
    pub(crate) fn device_may_overlap(&self) -> bool {
        matches!(self.device, DeviceReduce::Staged(_))
    }

    /// Averages a step's gradients across the ranks, bucket by bucket. A world
    /// of one with nothing to compress leaves them as they are.
    pub(crate) fn average(&self, grads: StepGradients<'_, I>) -> Result<(), TrainError> {
        let host = &self.host;
        if host.comm.world_size() == 1 && host.compression == Compression::None {
            return Ok(());
        }
        match grads {
            StepGradients::Host(grads) => {
                (0..host.plan.buckets.len()).try_for_each(|b| host.average_bucket(b, grads))
            }
            StepGradients::Device(grads) => {
                let reducer: &dyn BucketAllReduce<I> = match &self.device {
                    DeviceReduce::Staged(staging) => staging,
                    DeviceReduce::Given(reducer) => reducer.as_ref(),
                };
                Ok(reducer.all_reduce(host.comm, NAME, grads, &host.plan, ReduceOptions::average())?)
            }
        }
    }
}

impl HostBuckets<'_> {
    /// The buckets.
    pub(crate) fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Averages bucket `b` of the plan, of gradients held as host buffers
    /// (every gradient of the step, module order).
    pub(crate) fn average_bucket(&self, b: usize, grads: &mut [Vec<f32>]) -> Result<(), TrainError> {
        let mut all: Vec<&mut [f32]> = grads.iter_mut().map(Vec::as_mut_slice).collect();
        let (name, bucket) = (bucket_name(NAME, b), &self.plan.buckets[b]);
        all_reduce_one(self.comm, &name, &mut all, bucket, ReduceOptions::average(), self.compression)?;
        Ok(())
    }
}

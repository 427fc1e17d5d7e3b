//! The backend placement: parameters, gradients and AdamW state as tensors on
//! the backend's device, and its use of the one seam where gradients leave it
//! (drove-device's [`BucketAllReduce`]).
//!
//! Gradients are taken from burn's `GradientsParams` as flat 1-D tensors (a
//! reshape, no copy), summed over micro-batches and passes on the device,
//! fused into buckets (`drove_kernels::pack::concat`: `Tensor::cat`'s
//! values, in a launch for each group of gradients on the GPU backends), and
//! handed to a [`BucketAllReduce`] one bucket at a time. [`HostStaging`], the
//! default, copies a bucket to one host buffer, all-reduces it through the
//! [`Collective`] and copies it back; a device collective (NCCL) implements
//! the same trait on the bucket's device memory and nothing else changes.
//! Clipping and [`DeviceAdamW`] run in burn ops over one flat buffer for
//! every parameter (`optim`): the maths of
//! [`crate::flat::FlatAdamW`], element for element, so both placements take
//! the same step, in a handful of kernels instead of a dozen per parameter.
//!
//! Host syncs left on this path: one scalar read per micro-batch for the loss
//! value, and one for the global gradient norm, after the update is queued.

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use drove_collective::fusion::{Bucket, Compression, FusionOptions, Plan};
use drove_collective::{Collective, ReduceOptions, all_reduce_rows};

use drove_device::{BucketAllReduce, DeviceError, HostStaging, read_back};

use crate::TrainError;

/// Takes every float gradient of `model` out of `grads` as a flat 1-D tensor
/// on the device, in module order (zeros for a parameter that got none).
pub fn take_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
    device: &B::Device,
) -> Vec<Tensor<B::InnerBackend, 1>> {
    struct Take<'a, B: AutodiffBackend> {
        grads: &'a mut GradientsParams,
        device: &'a B::Device,
        out: Vec<Tensor<B::InnerBackend, 1>>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Take<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let numel: usize = param.val().dims().iter().product();
            let grad = match self.grads.remove::<B::InnerBackend, D>(param.id) {
                Some(g) => g.reshape([numel]),
                None => Tensor::zeros([numel], self.device),
            };
            self.out.push(grad);
        }
    }
    let mut take = Take::<B> { grads, device, out: Vec::new() };
    model.visit(&mut take);
    take.out
}

/// Averages `grads` across the ranks of `comm`, in buckets of at most
/// `fusion.threshold_bytes`, each through `reducer`. A world of one without
/// compression leaves them as they are.
pub fn all_reduce_buckets<B: Backend>(
    reducer: &dyn BucketAllReduce<B>,
    comm: &dyn Collective,
    grads: &mut [Tensor<B, 1>],
    fusion: FusionOptions,
) -> Result<(), TrainError> {
    let bytes: Vec<usize> = grads.iter().map(|g| g.dims()[0] * 4).collect();
    all_reduce_planned(reducer, comm, grads, fusion, &Plan::dense(&bytes, fusion.threshold_bytes))
}

/// [`all_reduce_buckets`] with the buckets of `plan`. Its row-sparse tables
/// go through the host ([`all_reduce_rows`]) when `reducer` is
/// [`HostStaging`]; a device collective gets every gradient in dense
/// buckets, the tables included (sending rows is a saving of the host path).
pub fn all_reduce_planned<B: Backend>(
    reducer: &dyn BucketAllReduce<B>,
    comm: &dyn Collective,
    grads: &mut [Tensor<B, 1>],
    fusion: FusionOptions,
    plan: &Plan,
) -> Result<(), TrainError> {
    if comm.world_size() == 1 && fusion.compression == Compression::None {
        return Ok(());
    }
    let sizes: Vec<usize> = grads.iter().map(|g| g.dims()[0]).collect();
    let staging = reducer.host_staging();
    let dense;
    let plan = if staging.is_some() {
        plan
    } else {
        let bytes: Vec<usize> = sizes.iter().map(|n| n * 4).collect();
        dense = Plan::dense(&bytes, fusion.threshold_bytes);
        &dense
    };
    let packed: Vec<(String, Tensor<B, 1>)> = plan
        .buckets
        .iter()
        .enumerate()
        .map(|(b, bucket)| {
            // One launch a group of gradients on the GPU backends (`cat`
            // launches one a gradient); the first itself when alone.
            let parts: Vec<Tensor<B, 1>> = bucket.tensors().map(|i| grads[i].clone()).collect();
            (format!("gradients.bucket{b}"), drove_kernels::pack::concat(parts))
        })
        .collect();
    let reduced = match staging {
        Some(staging) => staged_overlapped(&staging, comm, packed, plan)?,
        None => packed
            .into_iter()
            .map(|(name, bucket)| {
                let reduced = reducer.all_reduce(comm, &name, bucket, ReduceOptions::average())?;
                Ok((name, reduced))
            })
            .collect::<Result<_, TrainError>>()?,
    };
    for ((name, reduced), bucket) in reduced.into_iter().zip(&plan.buckets) {
        let lengths: Vec<usize> = bucket.tensors().map(|i| sizes[i]).collect();
        if reduced.dims()[0] != lengths.iter().sum::<usize>() {
            return Err(TrainError::Options(format!(
                "{name}: the bucket all-reduce returned {} values for a bucket of {}",
                reduced.dims()[0],
                lengths.iter().sum::<usize>()
            )));
        }
        let pieces = if lengths.len() == 1 { vec![reduced] } else { reduced.split_with_sizes(lengths, 0) };
        for (i, piece) in bucket.tensors().zip(pieces) {
            grads[i] = piece;
        }
    }
    Ok(())
}

/// Host staging of the buckets, pipelined: a reader thread copies bucket
/// `b + 1` back from the device while this thread all-reduces bucket `b`
/// through the collective (which is the network's time, not the device's),
/// then writes it back. At most one bucket waits on the host ahead of the
/// all-reduce. A failed read ends the reader; a failed all-reduce drops the
/// channel, which ends it too. A row-sparse table of `plan` (whose buckets
/// `packed` holds, in order) goes through [`all_reduce_rows`].
fn staged_overlapped<B: Backend>(
    staging: &HostStaging,
    comm: &dyn Collective,
    packed: Vec<(String, Tensor<B, 1>)>,
    plan: &Plan,
) -> Result<Vec<(String, Tensor<B, 1>)>, TrainError> {
    let Some((_, first)) = packed.first() else { return Ok(Vec::new()) };
    let device = first.device();
    let names: Vec<String> = packed.iter().map(|(name, _)| name.clone()).collect();
    // The reader is another thread, and a GPU backend's queue is per thread
    // (cubecl's streams): the gradients are finished here before it reads
    // them, or it could read a bucket the backward pass has not written yet.
    B::sync(&device).map_err(|e| {
        TrainError::Device(DeviceError::Gpu(format!("finishing the backward pass on the device: {e:?}")))
    })?;
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<f32>, TrainError>>(1);
        scope.spawn(move || {
            for (name, bucket) in packed {
                let read = read_back(&name, bucket).map_err(TrainError::from);
                let failed = read.is_err();
                if tx.send(read).is_err() || failed {
                    break;
                }
            }
        });
        names
            .into_iter()
            .zip(&plan.buckets)
            .map(|(name, bucket)| {
                let mut staged = rx.recv().map_err(|_| {
                    TrainError::Device(DeviceError::Gpu(format!("{name}: the reader thread stopped")))
                })??;
                let average = ReduceOptions::average();
                let reduced = match bucket {
                    Bucket::Rows { row_len, .. } => {
                        all_reduce_rows(comm, &name, &mut staged, *row_len, average)?;
                        let n = staged.len();
                        drove_kernels::transfer::upload(burn::tensor::TensorData::new(staged, [n]), &device)
                    }
                    Bucket::Fused(_) => staging.reduce_staged::<B>(comm, &name, staged, average, &device)?,
                };
                Ok((name, reduced))
            })
            .collect()
    })
}

mod optim;
pub use optim::{DeviceAdamW, clip_global_norm, flatten, global_norm, scalar};

//! [`HostStaging`], the default [`BucketAllReduce`]: each bucket copied to one
//! host buffer, averaged by the [`Collective`] (optionally compressed on the
//! wire, a row-sparse table as the rows it touched), and copied back, as
//! Horovod does without NCCL; and [`read_back`], the copy to the host.
//!
//! The copies are pipelined: a reader thread copies bucket `b + 1` back from
//! the device while the caller's thread all-reduces bucket `b` through the
//! collective (the network's time, not the device's), then uploads it. At
//! most one bucket waits on the host ahead of the all-reduce.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use drove_collective::fusion::{Bucket, Compression, FusionOptions, Plan, all_reduce_fused};
use drove_collective::{Collective, ReduceOptions, all_reduce_rows};

use crate::DeviceError;
use crate::reduce::{BucketAllReduce, bucket_name, pack_bucket, unpack_bucket};

/// The default [`BucketAllReduce`]: each bucket goes to one host buffer,
/// through the [`Collective`] (optionally compressed on the wire; a row-sparse
/// table of the plan as the rows it touched), and back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStaging {
    /// Wire format of the dense buckets.
    pub compression: Compression,
}

impl<B: Backend> BucketAllReduce<B> for HostStaging {
    fn all_reduce(
        &self,
        comm: &dyn Collective,
        name: &str,
        grads: &mut [Tensor<B, 1>],
        plan: &Plan,
        op: ReduceOptions,
    ) -> Result<(), DeviceError> {
        let Some(first) = grads.first() else { return Ok(()) };
        let device = first.device();
        let packed: Vec<Tensor<B, 1>> =
            plan.buckets.iter().map(|bucket| pack_bucket(grads, bucket)).collect();
        // The reader is another thread, and a GPU backend's queue is per
        // thread (cubecl's streams): the gradients are finished here before
        // it reads them, or it could read a bucket not written yet.
        B::sync(&device)
            .map_err(|e| DeviceError::Gpu(format!("finishing the backward pass on the device: {e:?}")))?;
        let reduced = std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<f32>, DeviceError>>(1);
            scope.spawn(move || {
                for (b, bucket) in packed.into_iter().enumerate() {
                    let read = read_back(&bucket_name(name, b), bucket);
                    let failed = read.is_err();
                    if tx.send(read).is_err() || failed {
                        break;
                    }
                }
            });
            plan.buckets
                .iter()
                .enumerate()
                .map(|(b, bucket)| {
                    let name = bucket_name(name, b);
                    let stopped = || DeviceError::Gpu(format!("{name}: the reader thread stopped"));
                    let staged = rx.recv().map_err(|_| stopped())??;
                    self.reduce_staged::<B>(comm, &name, bucket, staged, op, &device)
                })
                .collect::<Result<Vec<_>, DeviceError>>()
        })?;
        for (b, (bucket, reduced)) in plan.buckets.iter().zip(reduced).enumerate() {
            unpack_bucket(&bucket_name(name, b), reduced, bucket, grads)?;
        }
        Ok(())
    }
}

impl HostStaging {
    /// All-reduces `bucket`, already read back to the host ([`read_back`]),
    /// and writes it to `device`.
    fn reduce_staged<B: Backend>(
        &self,
        comm: &dyn Collective,
        name: &str,
        bucket: &Bucket,
        mut staged: Vec<f32>,
        op: ReduceOptions,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, DeviceError> {
        match bucket {
            Bucket::Rows { row_len, .. } => {
                all_reduce_rows(comm, name, &mut staged, *row_len, op)?;
            }
            Bucket::Fused(_) => {
                let fusion = FusionOptions { threshold_bytes: 0, compression: self.compression };
                all_reduce_fused(comm, name, &mut [staged.as_mut_slice()], op, fusion)?;
            }
        }
        let n = staged.len();
        Ok(drove_kernels::transfer::upload(TensorData::new(staged, [n]), device))
    }
}

/// Copies `bucket` from the device to one host buffer of f32; a device that
/// failed (lost, out of memory) is an error naming the bucket, never a panic.
pub fn read_back<B: Backend>(name: &str, bucket: Tensor<B, 1>) -> Result<Vec<f32>, DeviceError> {
    drove_kernels::transfer::count_read();
    let data = bucket
        .try_into_data()
        .map_err(|e| DeviceError::Gpu(format!("reading {name} back from the device: {e}")))?;
    // `into_vec` hands over the tensor's own allocation when it can.
    data.convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| DeviceError::Gpu(format!("reading {name} back from the device as f32: {e:?}")))
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use drove_collective::LocalWorld;
    use drove_collective::fusion::Layout;

    use super::*;

    /// Two ranks, three gradients: a fused bucket of two and a row-sparse
    /// table whose rows only rank 1 touched.
    #[test]
    fn host_staging_averages_every_bucket_of_a_plan_across_two_ranks() {
        let world = LocalWorld::new(2).unwrap();
        let plan =
            Plan::new(&[12, 4, 16], &[Layout::Dense, Layout::Dense, Layout::Rows { row_len: 2 }], 1 << 20);
        assert_eq!(plan.buckets.len(), 2);
        let averaged: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = world
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let plan = &plan;
                    s.spawn(move || {
                        let device = Default::default();
                        let r = rank as f32;
                        let values = [vec![r * 2.0, 1.0, -r], vec![r], vec![0.0, 0.0, r * 4.0, r]];
                        let mut grads: Vec<Tensor<Flex, 1>> = values
                            .iter()
                            .map(|v| Tensor::from_data(TensorData::new(v.clone(), [v.len()]), &device))
                            .collect();
                        let staging = HostStaging::default();
                        staging.all_reduce(&comm, "g", &mut grads, plan, ReduceOptions::average()).unwrap();
                        grads.into_iter().map(|g| read_back("g", g).unwrap()).collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expected = vec![vec![1.0, 1.0, -0.5], vec![0.5], vec![0.0, 0.0, 2.0, 0.5]];
        assert_eq!(averaged, vec![expected; 2]);
    }
}

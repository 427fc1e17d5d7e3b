//! [`BucketAllReduce`], **the seam** where gradients leave a device, and
//! [`HostStaging`], its default: the bucket copied to one host buffer,
//! averaged by the [`Collective`] (optionally compressed on the wire), and
//! copied back, as Horovod does without NCCL. A device collective implements
//! the same trait on the bucket's device memory
//! (`cuda::NcclBuckets`, feature `nccl`) and nothing above it changes.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use drove_collective::fusion::{Compression, FusionOptions, all_reduce_fused};
use drove_collective::{Collective, ReduceOptions};

use crate::DeviceError;

/// The all-reduce of one bucket of gradients: the seam where a device
/// collective replaces host staging.
///
/// A bucket is the gradients of consecutive parameters (module order),
/// flattened and concatenated into one 1-D tensor on the backend's device.
/// Every rank calls this with buckets of the same names and lengths in the
/// same order; an implementation returns the reduced bucket (in place or as a
/// new tensor) or fails on every rank, never hangs past its deadline.
pub trait BucketAllReduce<B: Backend> {
    /// Reduces `bucket` across the ranks of `comm` with `op` (a replica asks
    /// for the average). `comm` is the host collective, for implementations
    /// that check descriptions over it before a device op.
    fn all_reduce(
        &self,
        comm: &dyn Collective,
        name: &str,
        bucket: Tensor<B, 1>,
        op: ReduceOptions,
    ) -> Result<Tensor<B, 1>, DeviceError>;

    /// `Some` when this reducer is [`HostStaging`]: a caller with several
    /// buckets may then read the next one back from the device while the
    /// previous one is all-reduced ([`HostStaging::reduce_staged`]), instead
    /// of one bucket at a time.
    fn host_staging(&self) -> Option<HostStaging> {
        None
    }
}

/// The default [`BucketAllReduce`]: the bucket goes to one host buffer, through
/// the [`Collective`] (optionally compressed on the wire), and back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStaging {
    /// Wire format.
    pub compression: Compression,
}

impl<B: Backend> BucketAllReduce<B> for HostStaging {
    fn all_reduce(
        &self,
        comm: &dyn Collective,
        name: &str,
        bucket: Tensor<B, 1>,
        op: ReduceOptions,
    ) -> Result<Tensor<B, 1>, DeviceError> {
        let device = bucket.device();
        let staged = read_back(name, bucket)?;
        self.reduce_staged(comm, name, staged, op, &device)
    }

    fn host_staging(&self) -> Option<HostStaging> {
        Some(*self)
    }
}

impl HostStaging {
    /// All-reduces a bucket already read back to the host ([`read_back`])
    /// and writes it to `device`.
    pub fn reduce_staged<B: Backend>(
        &self,
        comm: &dyn Collective,
        name: &str,
        mut staged: Vec<f32>,
        op: ReduceOptions,
        device: &B::Device,
    ) -> Result<Tensor<B, 1>, DeviceError> {
        let n = staged.len();
        let fusion = FusionOptions { threshold_bytes: 0, compression: self.compression };
        all_reduce_fused(comm, name, &mut [staged.as_mut_slice()], op, fusion)?;
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

    use super::*;

    #[test]
    fn host_staging_averages_a_bucket_across_two_ranks() {
        let world = LocalWorld::new(2).unwrap();
        let averaged: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = world
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    s.spawn(move || {
                        let device = Default::default();
                        let values = vec![rank as f32 * 2.0, 1.0, -(rank as f32)];
                        let bucket = Tensor::<Flex, 1>::from_data(TensorData::new(values, [3]), &device);
                        let staging = HostStaging::default();
                        assert!(BucketAllReduce::<Flex>::host_staging(&staging).is_some());
                        let out = staging.all_reduce(&comm, "b0", bucket, ReduceOptions::average()).unwrap();
                        read_back("b0", out).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(averaged, vec![vec![1.0, 1.0, -0.5]; 2]);
    }
}

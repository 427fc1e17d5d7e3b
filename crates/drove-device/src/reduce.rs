//! [`BucketAllReduce`], **the seam** where gradients leave a device, and the
//! parts an implementation packs and unpacks buckets with ([`pack_bucket`],
//! [`unpack_bucket`]). Host staging, the default, is in `staging.rs`
//! ([`HostStaging`](crate::HostStaging)); a device collective implements the
//! same trait on the buckets' device memory (`cuda::NcclBuckets`, feature
//! `nccl`) and nothing above it changes.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use drove_collective::fusion::{Bucket, Plan};
use drove_collective::{Collective, ReduceOptions};

use crate::DeviceError;

/// The all-reduce of a step's gradients on a device: the seam where a device
/// collective replaces host staging, as a comm hook replaces PyTorch DDP's
/// all-reduce.
///
/// The gradients are flat 1-D tensors on the backend's device, one a
/// parameter in module order; `plan` groups them into buckets (runs of
/// consecutive gradients, and row-sparse tables alone), the same on every
/// rank. Every rank calls this with gradients of the same lengths and the same
/// plan; an implementation replaces each gradient by its reduction across the
/// ranks (in place or by new tensors), bucket by bucket as the plan says or as
/// it sees fit, or fails on every rank, never hangs past its deadline.
pub trait BucketAllReduce<B: Backend> {
    /// Reduces every gradient of `grads` across the ranks of `comm` with `op`
    /// (a replica asks for the average). `comm` is the host collective, for
    /// implementations that reduce through it or check descriptions over it
    /// before a device op; `name` prefixes the collective's op names
    /// ([`bucket_name`]).
    fn all_reduce(
        &self,
        comm: &dyn Collective,
        name: &str,
        grads: &mut [Tensor<B, 1>],
        plan: &Plan,
        op: ReduceOptions,
    ) -> Result<(), DeviceError>;
}

/// The op name of bucket `index` of the gradients named `name`.
pub fn bucket_name(name: &str, index: usize) -> String {
    format!("{name}.bucket{index}")
}

/// The gradients `bucket` covers, packed end to end into one 1-D tensor: in
/// one launch a group of gradients on the GPU backends (burn's `cat` launches
/// one a gradient); a gradient alone is itself.
pub fn pack_bucket<B: Backend>(grads: &[Tensor<B, 1>], bucket: &Bucket) -> Tensor<B, 1> {
    let parts: Vec<Tensor<B, 1>> = bucket.tensors().map(|i| grads[i].clone()).collect();
    drove_kernels::pack::concat(parts)
}

/// Writes `reduced`, the reduction of bucket `name` (packed by
/// [`pack_bucket`]), back over the gradients `bucket` covers; a tensor of
/// another length is an error naming the bucket.
pub fn unpack_bucket<B: Backend>(
    name: &str,
    reduced: Tensor<B, 1>,
    bucket: &Bucket,
    grads: &mut [Tensor<B, 1>],
) -> Result<(), DeviceError> {
    let lengths: Vec<usize> = bucket.tensors().map(|i| grads[i].dims()[0]).collect();
    let expected: usize = lengths.iter().sum();
    let found = reduced.dims()[0];
    if found != expected {
        return Err(DeviceError::BucketLength { bucket: name.to_string(), found, expected });
    }
    let pieces = if lengths.len() == 1 { vec![reduced] } else { reduced.split_with_sizes(lengths, 0) };
    for (i, piece) in bucket.tensors().zip(pieces) {
        grads[i] = piece;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    use super::*;

    fn tensor(values: &[f32]) -> Tensor<Flex, 1> {
        Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), &Default::default())
    }

    #[test]
    fn a_bucket_unpacks_to_the_gradients_it_packed() {
        let mut grads = vec![tensor(&[1.0]), tensor(&[2.0, 3.0]), tensor(&[4.0, 5.0, 6.0])];
        let bucket = Bucket::Fused(1..3);
        let packed = pack_bucket(&grads, &bucket);
        assert_eq!(packed.to_data().to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0, 6.0]);
        unpack_bucket("b", packed.mul_scalar(2.0), &bucket, &mut grads).unwrap();
        let values: Vec<Vec<f32>> = grads.iter().map(|g| g.to_data().to_vec::<f32>().unwrap()).collect();
        assert_eq!(values, vec![vec![1.0], vec![4.0, 6.0], vec![8.0, 10.0, 12.0]]);
        let err = unpack_bucket("gradients.bucket1", tensor(&[1.0]), &bucket, &mut grads).unwrap_err();
        assert!(err.to_string().contains("gradients.bucket1"), "{err}");
    }
}

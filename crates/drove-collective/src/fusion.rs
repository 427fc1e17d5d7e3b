//! Gradient helpers: many small tensors fused into buckets before the all-reduce,
//! and optional half-precision compression on the wire.

use half::{bf16, f16};

use crate::collective::Collective;
use crate::dtype::{Buffer, DType};
use crate::error::CommError;
use crate::op::ReduceOptions;

/// Default bucket size: 4 MiB, small enough that an overlapped step's
/// buckets start while backward goes on (MiniLM's 91 MB of gradients make 23,
/// the word embedding alone in one), large enough that a message's fixed cost
/// is small beside its bytes. Horovod fuses up to 64 MiB of the tensors ready
/// in a cycle; PyTorch DDP fills 25 MB buckets in the order gradients became
/// ready; a bucket here is a fixed run of parameters, the same on every rank
/// and in every step, so that it can start the moment its last gradient is in.
pub const DEFAULT_FUSION_BYTES: usize = 4 << 20;

/// What travels on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    /// f32 as it is.
    #[default]
    None,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
}

/// Fusion settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusionOptions {
    /// Largest bucket in bytes (of f32 data); 0 turns fusion off.
    pub threshold_bytes: usize,
    /// Wire format.
    pub compression: Compression,
}

impl Default for FusionOptions {
    fn default() -> Self {
        FusionOptions { threshold_bytes: DEFAULT_FUSION_BYTES, compression: Compression::None }
    }
}

/// Groups tensor indices into buckets of at most `threshold` bytes; a tensor
/// larger than the threshold gets a bucket of its own. Each bucket is a run of
/// consecutive tensors, listed in order, filled from the last tensor back (as
/// PyTorch DDP fills its buckets): backward finishes a model's last
/// parameters first, so the full buckets are the ones it finishes first, and
/// the partial one holds the first parameters, which it finishes last.
pub fn buckets(sizes_bytes: &[usize], threshold: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current = Vec::new();
    let mut bytes = 0;
    for (i, &size) in sizes_bytes.iter().enumerate().rev() {
        if !current.is_empty() && (threshold == 0 || bytes + size > threshold) {
            current.reverse();
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        current.push(i);
        bytes += size;
    }
    if !current.is_empty() {
        current.reverse();
        out.push(current);
    }
    out.reverse();
    out
}

/// All-reduces every tensor of `tensors` in place (f32 gradients), fusing them
/// into buckets of at most `fusion.threshold_bytes` and compressing the wire
/// format if asked. Ranks must pass tensors of the same sizes in the same order.
pub fn all_reduce_fused<C: Collective + ?Sized>(
    comm: &C,
    name: &str,
    tensors: &mut [&mut [f32]],
    opts: ReduceOptions,
    fusion: FusionOptions,
) -> Result<(), CommError> {
    if comm.world_size() == 1
        && matches!(fusion.compression, Compression::None)
        && opts.prescale == 1.0
        && opts.postscale == 1.0
    {
        // Sum, average, min, max and product over one rank leave every value as
        // it is: no packing, no copies.
        return Ok(());
    }
    let sizes: Vec<usize> = tensors.iter().map(|t| t.len() * 4).collect();
    for (b, bucket) in buckets(&sizes, fusion.threshold_bytes).into_iter().enumerate() {
        // A bucket is a run of consecutive tensors.
        let parts = &mut tensors[bucket[0]..bucket[bucket.len() - 1] + 1];
        all_reduce_bucket(comm, &format!("{name}.bucket{b}"), parts, opts, fusion.compression)?;
    }
    Ok(())
}

/// All-reduces one bucket: `parts` packed into one buffer (compressed if
/// asked), reduced, and copied back, as [`all_reduce_fused`] does for each of
/// its buckets. For callers that issue buckets themselves (an overlapped step
/// reduces each as soon as its gradients are ready): the same parts give the
/// same values bit for bit.
pub fn all_reduce_bucket<C: Collective + ?Sized>(
    comm: &C,
    name: &str,
    parts: &mut [&mut [f32]],
    opts: ReduceOptions,
    compression: Compression,
) -> Result<(), CommError> {
    let total: usize = parts.iter().map(|t| t.len()).sum();
    let mut packed = match compression {
        Compression::None => Buffer::zeros(DType::F32, total),
        Compression::F16 => Buffer::zeros(DType::F16, total),
        Compression::BF16 => Buffer::zeros(DType::BF16, total),
    };
    let mut offset = 0;
    for t in parts.iter() {
        match &mut packed {
            Buffer::F32(p) => p[offset..offset + t.len()].copy_from_slice(t),
            Buffer::F16(p) => {
                p[offset..offset + t.len()].iter_mut().zip(t.iter()).for_each(|(d, &s)| *d = f16::from_f32(s))
            }
            Buffer::BF16(p) => p[offset..offset + t.len()]
                .iter_mut()
                .zip(t.iter())
                .for_each(|(d, &s)| *d = bf16::from_f32(s)),
            _ => unreachable!("packed buffers are f32, f16 or bf16"),
        }
        offset += t.len();
    }
    comm.all_reduce(name, &[total], packed.as_mut(), opts)?;
    let mut offset = 0;
    for t in parts.iter_mut() {
        match &packed {
            Buffer::F32(p) => t.copy_from_slice(&p[offset..offset + t.len()]),
            Buffer::F16(p) => t.iter_mut().zip(&p[offset..]).for_each(|(d, s)| *d = s.to_f32()),
            Buffer::BF16(p) => t.iter_mut().zip(&p[offset..]).for_each(|(d, s)| *d = s.to_f32()),
            _ => unreachable!("packed buffers are f32, f16 or bf16"),
        }
        offset += t.len();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_respect_the_threshold_and_order() {
        assert_eq!(buckets(&[10, 10, 10, 50, 5], 25), vec![vec![0], vec![1, 2], vec![3], vec![4]]);
        assert_eq!(buckets(&[5, 10, 10, 10], 20), vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(buckets(&[10, 10], 0), vec![vec![0], vec![1]]);
        assert_eq!(buckets(&[10, 10, 10], 1 << 20), vec![vec![0, 1, 2]]);
        assert!(buckets(&[], 10).is_empty());
    }
}

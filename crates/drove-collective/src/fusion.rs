//! Gradient helpers: many small tensors fused into buckets before the all-reduce,
//! optional half-precision compression on the wire, and a [`Plan`] that sends
//! row-sparse tables (embeddings) as their rows ([`crate::all_reduce_rows`]).

use std::ops::Range;

use half::{bf16, f16};

use crate::collective::Collective;
use crate::dtype::{Buffer, DType};
use crate::error::CommError;
use crate::op::ReduceOptions;
use crate::rows::all_reduce_rows;

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

/// How one tensor of a step's gradients is all-reduced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Packed with its neighbours into a bucket.
    #[default]
    Dense,
    /// On its own, as the rows that are not all zero ([`all_reduce_rows`]):
    /// a table of rows of `row_len` values whose gradient touches few rows.
    Rows {
        /// Values a row.
        row_len: usize,
    },
}

/// One all-reduce of a [`Plan`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bucket {
    /// A run of consecutive dense tensors, packed into one buffer.
    Fused(Range<usize>),
    /// One row-sparse tensor.
    Rows {
        /// The tensor.
        tensor: usize,
        /// Values a row.
        row_len: usize,
    },
}

impl Bucket {
    /// The tensors the bucket covers.
    pub fn tensors(&self) -> Range<usize> {
        match self {
            Bucket::Fused(range) => range.clone(),
            Bucket::Rows { tensor, .. } => *tensor..tensor + 1,
        }
    }
}

/// The all-reduces of a step's gradients, in tensor order: each row-sparse
/// tensor on its own, the dense ones between them in buckets as [`buckets`]
/// makes them. The same tensors and layouts give the same plan on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The buckets, in tensor order.
    pub buckets: Vec<Bucket>,
}

impl Plan {
    /// The plan for tensors of `sizes_bytes` laid out as `layouts` (a
    /// missing layout is [`Layout::Dense`]), dense buckets of at most
    /// `threshold` bytes.
    pub fn new(sizes_bytes: &[usize], layouts: &[Layout], threshold: usize) -> Self {
        let layout = |i: usize| layouts.get(i).copied().unwrap_or_default();
        let mut out = Vec::new();
        let mut start = 0;
        for i in 0..=sizes_bytes.len() {
            let row_len = match (i < sizes_bytes.len()).then(|| layout(i)) {
                Some(Layout::Dense) => continue,
                Some(Layout::Rows { row_len }) => Some(row_len),
                None => None,
            };
            let run = buckets(&sizes_bytes[start..i], threshold);
            out.extend(run.into_iter().map(|b| Bucket::Fused(start + b[0]..start + b[b.len() - 1] + 1)));
            if let Some(row_len) = row_len {
                out.push(Bucket::Rows { tensor: i, row_len });
            }
            start = i + 1;
        }
        Plan { buckets: out }
    }

    /// Every tensor dense: the buckets of [`buckets`].
    pub fn dense(sizes_bytes: &[usize], threshold: usize) -> Self {
        Self::new(sizes_bytes, &[], threshold)
    }
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
    let sizes: Vec<usize> = tensors.iter().map(|t| t.len() * 4).collect();
    all_reduce_planned(
        comm,
        name,
        tensors,
        &Plan::dense(&sizes, fusion.threshold_bytes),
        opts,
        fusion.compression,
    )
}

/// All-reduces every tensor of `tensors` in place as `plan` says: each
/// bucket in turn, named `"{name}.bucket{b}"`, dense buckets through
/// [`all_reduce_bucket`], row-sparse tensors through [`all_reduce_rows`] (as
/// `f32`, whatever `compression`). A world of one with nothing to scale or
/// compress leaves every value as it is.
pub fn all_reduce_planned<C: Collective + ?Sized>(
    comm: &C,
    name: &str,
    tensors: &mut [&mut [f32]],
    plan: &Plan,
    opts: ReduceOptions,
    compression: Compression,
) -> Result<(), CommError> {
    if comm.world_size() == 1
        && matches!(compression, Compression::None)
        && opts.prescale == 1.0
        && opts.postscale == 1.0
    {
        // Sum, average, min, max and product over one rank leave every value as
        // it is: no packing, no copies.
        return Ok(());
    }
    for (b, bucket) in plan.buckets.iter().enumerate() {
        all_reduce_one(comm, &format!("{name}.bucket{b}"), tensors, bucket, opts, compression)?;
    }
    Ok(())
}

/// All-reduces the tensors of one bucket of a [`Plan`] (`tensors` holds every
/// tensor of the plan), as [`all_reduce_planned`] does for each; for callers
/// that issue buckets themselves (an overlapped step reduces each as soon as
/// its gradients are ready): the same bucket gives the same values bit for bit.
pub fn all_reduce_one<C: Collective + ?Sized>(
    comm: &C,
    name: &str,
    tensors: &mut [&mut [f32]],
    bucket: &Bucket,
    opts: ReduceOptions,
    compression: Compression,
) -> Result<(), CommError> {
    match bucket {
        Bucket::Fused(range) => all_reduce_bucket(comm, name, &mut tensors[range.clone()], opts, compression),
        Bucket::Rows { tensor, row_len } => {
            all_reduce_rows(comm, name, tensors[*tensor], *row_len, opts).map(|_| ())
        }
    }
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

    #[test]
    fn a_plan_puts_row_sparse_tensors_alone_and_buckets_the_runs_between() {
        let rows = Layout::Rows { row_len: 4 };
        let layouts = [Layout::Dense, rows, Layout::Dense, Layout::Dense, Layout::Dense, rows];
        let plan = Plan::new(&[10, 400, 10, 10, 10, 40], &layouts, 25);
        assert_eq!(
            plan.buckets,
            vec![
                Bucket::Fused(0..1),
                Bucket::Rows { tensor: 1, row_len: 4 },
                Bucket::Fused(2..3),
                Bucket::Fused(3..5),
                Bucket::Rows { tensor: 5, row_len: 4 }
            ]
        );
        let dense = Plan::dense(&[10, 10, 10, 50, 5], 25);
        let expected: Vec<Bucket> = buckets(&[10, 10, 10, 50, 5], 25)
            .into_iter()
            .map(|b| Bucket::Fused(b[0]..b[b.len() - 1] + 1))
            .collect();
        assert_eq!(dense.buckets, expected);
        assert_eq!(plan.buckets[3].tensors(), 3..5);
    }
}

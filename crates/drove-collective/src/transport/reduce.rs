//! The reduction kernels on raw bytes, for transports: how two ranks'
//! elements combine, scaling, and an op's last step (averaging, the post
//! scale). Every transport uses these, so every transport reduces alike.

use half::{bf16, f16};

use crate::dtype::{DType, ReduceOp};

/// The combining step of an op (average combines as a sum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Add (sum and average).
    Sum,
    /// Keep the smaller.
    Min,
    /// Keep the larger.
    Max,
    /// Multiply.
    Product,
}

impl From<ReduceOp> for Combine {
    fn from(op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum | ReduceOp::Average => Combine::Sum,
            ReduceOp::Min => Combine::Min,
            ReduceOp::Max => Combine::Max,
            ReduceOp::Product => Combine::Product,
        }
    }
}

#[inline(always)]
fn combine_native<T: Copy + PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T>>(
    c: Combine,
    dst: &mut [T],
    src: &[T],
) {
    match c {
        Combine::Sum => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = *d + s),
        Combine::Product => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = *d * s),
        Combine::Min => dst.iter_mut().zip(src).for_each(|(d, &s)| {
            if s < *d {
                *d = s
            }
        }),
        Combine::Max => dst.iter_mut().zip(src).for_each(|(d, &s)| {
            if s > *d {
                *d = s
            }
        }),
    }
}

#[inline(always)]
fn combine_int<T: Copy + Ord>(c: Combine, dst: &mut [T], src: &[T], add: fn(T, T) -> T, mul: fn(T, T) -> T) {
    match c {
        Combine::Sum => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = add(*d, s)),
        Combine::Product => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = mul(*d, s)),
        Combine::Min => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = (*d).min(s)),
        Combine::Max => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = (*d).max(s)),
    }
}

fn combine_f32(c: Combine, a: f32, b: f32) -> f32 {
    match c {
        Combine::Sum => a + b,
        Combine::Product => a * b,
        Combine::Min => a.min(b),
        Combine::Max => a.max(b),
    }
}

/// `dst = dst (op) src`, element-wise, for elements of `dtype`.
pub fn combine_bytes(dtype: DType, c: Combine, dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    match dtype {
        DType::F32 => combine_native::<f32>(c, bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src)),
        DType::F64 => combine_native::<f64>(c, bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src)),
        DType::I32 => combine_int::<i32>(
            c,
            bytemuck::cast_slice_mut(dst),
            bytemuck::cast_slice(src),
            i32::wrapping_add,
            i32::wrapping_mul,
        ),
        DType::I64 => combine_int::<i64>(
            c,
            bytemuck::cast_slice_mut(dst),
            bytemuck::cast_slice(src),
            i64::wrapping_add,
            i64::wrapping_mul,
        ),
        DType::F16 => {
            let d: &mut [f16] = bytemuck::cast_slice_mut(dst);
            let s: &[f16] = bytemuck::cast_slice(src);
            d.iter_mut().zip(s).for_each(|(d, s)| *d = f16::from_f32(combine_f32(c, d.to_f32(), s.to_f32())));
        }
        DType::BF16 => {
            let d: &mut [bf16] = bytemuck::cast_slice_mut(dst);
            let s: &[bf16] = bytemuck::cast_slice(src);
            d.iter_mut()
                .zip(s)
                .for_each(|(d, s)| *d = bf16::from_f32(combine_f32(c, d.to_f32(), s.to_f32())));
        }
    }
}

/// `dst = srcs[0] (op) srcs[1] (op) ...` in that order; half types accumulate in
/// f32 and round once.
pub fn combine_many(dtype: DType, c: Combine, dst: &mut [u8], srcs: &[&[u8]]) {
    let (first, rest) = srcs.split_first().expect("at least one source");
    match dtype {
        DType::F16 | DType::BF16 => {
            const BLOCK: usize = 1024;
            let n = dst.len() / 2;
            let mut acc = [0f32; BLOCK];
            let mut start = 0;
            while start < n {
                let end = (start + BLOCK).min(n);
                let len = end - start;
                let load = |src: &[u8], out: &mut [f32]| {
                    if dtype == DType::F16 {
                        let s: &[f16] = bytemuck::cast_slice(&src[2 * start..2 * end]);
                        out.iter_mut().zip(s).for_each(|(o, v)| *o = v.to_f32());
                    } else {
                        let s: &[bf16] = bytemuck::cast_slice(&src[2 * start..2 * end]);
                        out.iter_mut().zip(s).for_each(|(o, v)| *o = v.to_f32());
                    }
                };
                load(first, &mut acc[..len]);
                let mut tmp = [0f32; BLOCK];
                for src in rest {
                    load(src, &mut tmp[..len]);
                    acc[..len].iter_mut().zip(&tmp[..len]).for_each(|(a, &t)| *a = combine_f32(c, *a, t));
                }
                if dtype == DType::F16 {
                    let d: &mut [f16] = bytemuck::cast_slice_mut(&mut dst[2 * start..2 * end]);
                    d.iter_mut().zip(&acc[..len]).for_each(|(d, &a)| *d = f16::from_f32(a));
                } else {
                    let d: &mut [bf16] = bytemuck::cast_slice_mut(&mut dst[2 * start..2 * end]);
                    d.iter_mut().zip(&acc[..len]).for_each(|(d, &a)| *d = bf16::from_f32(a));
                }
                start = end;
            }
        }
        _ => {
            dst.copy_from_slice(first);
            for src in rest {
                combine_bytes(dtype, c, dst, src);
            }
        }
    }
}

/// Multiplies every element by `factor` (floats only: integers are left as
/// they are, ops refuse scale factors on them; a no-op at 1.0).
pub fn scale_bytes(dtype: DType, factor: f64, data: &mut [u8]) {
    if factor == 1.0 {
        return;
    }
    match dtype {
        DType::F32 => {
            let f = factor as f32;
            bytemuck::cast_slice_mut::<u8, f32>(data).iter_mut().for_each(|x| *x *= f);
        }
        DType::F64 => bytemuck::cast_slice_mut::<u8, f64>(data).iter_mut().for_each(|x| *x *= factor),
        DType::F16 => bytemuck::cast_slice_mut::<u8, f16>(data)
            .iter_mut()
            .for_each(|x| *x = f16::from_f32(x.to_f32() * factor as f32)),
        DType::BF16 => bytemuck::cast_slice_mut::<u8, bf16>(data)
            .iter_mut()
            .for_each(|x| *x = bf16::from_f32(x.to_f32() * factor as f32)),
        DType::I32 | DType::I64 => {}
    }
}

/// Integer average: truncating division by `n` (floats are left as they are).
pub fn divide_ints(dtype: DType, n: i64, data: &mut [u8]) {
    match dtype {
        DType::I32 => bytemuck::cast_slice_mut::<u8, i32>(data).iter_mut().for_each(|x| *x /= n as i32),
        DType::I64 => bytemuck::cast_slice_mut::<u8, i64>(data).iter_mut().for_each(|x| *x /= n),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {}
    }
}

/// The final step of a reduction on a fully reduced segment: average and post-scale.
pub fn finish(dtype: DType, op: ReduceOp, world: usize, postscale: f64, data: &mut [u8]) {
    if dtype.is_float() {
        let mut factor = postscale;
        if op == ReduceOp::Average {
            factor /= world as f64;
        }
        scale_bytes(dtype, factor, data);
    } else if op == ReduceOp::Average {
        divide_ints(dtype, world as i64, data);
    }
}

/// How a reduce-scatter divides `n` rows among `parts` ranks: as evenly as
/// possible, lower ranks taking one more.
pub fn split_rows(n: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let (base, extra) = (n / parts.max(1), n % parts.max(1));
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let r = start..start + len;
            start += len;
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_even_and_covers() {
        assert_eq!(split_rows(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(split_rows(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
        assert_eq!(split_rows(0, 2), vec![0..0, 0..0]);
    }
}

//! Element types, typed views and owned buffers, and the reduction kernels.

use std::fmt;

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::I64)
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::F64 => 1,
            DType::F16 => 2,
            DType::BF16 => 3,
            DType::I32 => 4,
            DType::I64 => 5,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => DType::F32,
            1 => DType::F64,
            2 => DType::F16,
            3 => DType::BF16,
            4 => DType::I32,
            5 => DType::I64,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        })
    }
}

/// A type that can travel through a collective.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// Its [`DType`].
    const DTYPE: DType;
    /// Wraps a mutable slice.
    fn tensor_mut(data: &mut [Self]) -> TensorMut<'_>;
    /// Wraps a slice.
    fn tensor_ref(data: &[Self]) -> TensorRef<'_>;
    /// Wraps an owned vector.
    fn buffer(data: Vec<Self>) -> Buffer;
    /// Unwraps an owned buffer of this type.
    fn from_buffer(buffer: Buffer) -> Option<Vec<Self>>;
}

macro_rules! tensors {
    ($($variant:ident => $ty:ty),* $(,)?) => {
        /// A mutable, typed view of a tensor's elements (row-major).
        #[derive(Debug)]
        pub enum TensorMut<'a> {
            $(
                #[doc = concat!("`", stringify!($ty), "` elements.")]
                $variant(&'a mut [$ty]),
            )*
        }

        /// A typed view of a tensor's elements (row-major).
        #[derive(Clone, Copy, Debug)]
        pub enum TensorRef<'a> {
            $(
                #[doc = concat!("`", stringify!($ty), "` elements.")]
                $variant(&'a [$ty]),
            )*
        }

        /// An owned tensor buffer.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Buffer {
            $(
                #[doc = concat!("`", stringify!($ty), "` elements.")]
                $variant(Vec<$ty>),
            )*
        }

        impl TensorMut<'_> {
            /// The element type.
            pub fn dtype(&self) -> DType {
                match self { $(TensorMut::$variant(_) => DType::$variant,)* }
            }
            /// Number of elements.
            pub fn len(&self) -> usize {
                match self { $(TensorMut::$variant(d) => d.len(),)* }
            }
            /// Whether there is no element.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
            /// The raw bytes.
            pub fn bytes_mut(&mut self) -> &mut [u8] {
                match self { $(TensorMut::$variant(d) => bytemuck::cast_slice_mut(d),)* }
            }
            /// A shorter-lived mutable view of the same data.
            pub fn reborrow(&mut self) -> TensorMut<'_> {
                match self { $(TensorMut::$variant(d) => TensorMut::$variant(d),)* }
            }
        }

        impl TensorRef<'_> {
            /// The element type.
            pub fn dtype(&self) -> DType {
                match self { $(TensorRef::$variant(_) => DType::$variant,)* }
            }
            /// Number of elements.
            pub fn len(&self) -> usize {
                match self { $(TensorRef::$variant(d) => d.len(),)* }
            }
            /// Whether there is no element.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
            /// The raw bytes.
            pub fn bytes(&self) -> &[u8] {
                match self { $(TensorRef::$variant(d) => bytemuck::cast_slice(d),)* }
            }
        }

        impl Buffer {
            /// A zeroed buffer of `len` elements.
            pub fn zeros(dtype: DType, len: usize) -> Buffer {
                match dtype { $(DType::$variant => Buffer::$variant(vec![<$ty>::zeroed(); len]),)* }
            }
            /// The element type.
            pub fn dtype(&self) -> DType {
                match self { $(Buffer::$variant(_) => DType::$variant,)* }
            }
            /// Number of elements.
            pub fn len(&self) -> usize {
                match self { $(Buffer::$variant(d) => d.len(),)* }
            }
            /// Whether there is no element.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
            /// The raw bytes.
            pub fn bytes(&self) -> &[u8] {
                match self { $(Buffer::$variant(d) => bytemuck::cast_slice(d),)* }
            }
            /// The raw bytes, mutably.
            pub fn bytes_mut(&mut self) -> &mut [u8] {
                match self { $(Buffer::$variant(d) => bytemuck::cast_slice_mut(d),)* }
            }
            /// A mutable view.
            pub fn as_mut(&mut self) -> TensorMut<'_> {
                match self { $(Buffer::$variant(d) => TensorMut::$variant(d),)* }
            }
            /// A view.
            pub fn as_ref(&self) -> TensorRef<'_> {
                match self { $(Buffer::$variant(d) => TensorRef::$variant(d),)* }
            }
        }

        $(
            impl Element for $ty {
                const DTYPE: DType = DType::$variant;
                fn tensor_mut(data: &mut [Self]) -> TensorMut<'_> { TensorMut::$variant(data) }
                fn tensor_ref(data: &[Self]) -> TensorRef<'_> { TensorRef::$variant(data) }
                fn buffer(data: Vec<Self>) -> Buffer { Buffer::$variant(data) }
                fn from_buffer(buffer: Buffer) -> Option<Vec<Self>> {
                    match buffer { Buffer::$variant(d) => Some(d), _ => None }
                }
            }
            impl From<Vec<$ty>> for Buffer {
                fn from(v: Vec<$ty>) -> Self { Buffer::$variant(v) }
            }
        )*
    };
}

use bytemuck::Zeroable as _;

tensors!(F32 => f32, F64 => f64, F16 => f16, BF16 => bf16, I32 => i32, I64 => i64);

/// How values are combined across ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Sum divided by the world size (truncating for integers).
    Average,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Product.
    Product,
}

impl ReduceOp {
    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Average => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Product => 4,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Average,
            2 => ReduceOp::Min,
            3 => ReduceOp::Max,
            4 => ReduceOp::Product,
            _ => return None,
        })
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Average => "average",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Product => "product",
        })
    }
}

impl std::str::FromStr for ReduceOp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sum" => Ok(ReduceOp::Sum),
            "average" | "avg" | "mean" => Ok(ReduceOp::Average),
            "min" => Ok(ReduceOp::Min),
            "max" => Ok(ReduceOp::Max),
            "product" | "prod" => Ok(ReduceOp::Product),
            other => Err(format!("unknown reduce op {other:?}: expected sum, average, min, max or product")),
        }
    }
}

// ---- kernels on raw bytes -------------------------------------------------------

/// The combining step of an op (average combines as a sum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Combine {
    Sum,
    Min,
    Max,
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
pub(crate) fn combine_bytes(dtype: DType, c: Combine, dst: &mut [u8], src: &[u8]) {
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
pub(crate) fn combine_many(dtype: DType, c: Combine, dst: &mut [u8], srcs: &[&[u8]]) {
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

/// Multiplies every element by `factor` (floats only; a no-op at 1.0).
pub(crate) fn scale_bytes(dtype: DType, factor: f64, data: &mut [u8]) {
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
        DType::I32 | DType::I64 => unreachable!("scale factors are refused for integer tensors"),
    }
}

/// Integer average: truncating division by `n`.
pub(crate) fn divide_ints(dtype: DType, n: i64, data: &mut [u8]) {
    match dtype {
        DType::I32 => bytemuck::cast_slice_mut::<u8, i32>(data).iter_mut().for_each(|x| *x /= n as i32),
        DType::I64 => bytemuck::cast_slice_mut::<u8, i64>(data).iter_mut().for_each(|x| *x /= n),
        _ => unreachable!("only for integers"),
    }
}

/// The final step of a reduction on a fully reduced segment: average and post-scale.
pub(crate) fn finish(dtype: DType, op: ReduceOp, world: usize, postscale: f64, data: &mut [u8]) {
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

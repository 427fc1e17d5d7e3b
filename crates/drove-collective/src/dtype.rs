//! Element types, typed views and owned buffers.

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

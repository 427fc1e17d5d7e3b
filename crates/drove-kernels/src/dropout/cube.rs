//! [`DropoutBackend`] on burn-cubecl's backend: one launch of the kernel.

use burn::tensor::ops::FloatTensor;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::{DropoutBackend, Mask, kernel};

impl<R, F, I, BT> DropoutBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn masked(x: FloatTensor<Self>, mask: Mask) -> FloatTensor<Self> {
        let x = into_contiguous(x);
        let shape = x.meta.shape().clone();
        let output =
            empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), shape.clone(), x.dtype);
        let n = shape.num_elements();
        if n == 0 {
            return output;
        }
        let (_, per_row) = Mask::rows_of(&shape);
        let (key, row_base, threshold) = (mask.call_key(), mask.first_row.wrapping_add(1), mask.threshold());
        let client = x.client.clone();
        let cube_dim = CubeDim::new(&client, n);
        let cube_count = calculate_cube_count_elemwise(&client, n, cube_dim);
        let dtype = x.dtype;
        // SAFETY: the kernel reads and writes element ABSOLUTE_POS only when
        // it is below the output's length, which is the input's.
        unsafe {
            kernel::masked::launch_unchecked::<R>(
                &client,
                cube_count,
                cube_dim,
                x.into_tensor_arg(),
                output.clone().into_tensor_arg(),
                per_row as u32,
                key as u32,
                (key >> 32) as u32,
                row_base as u32,
                (row_base >> 32) as u32,
                threshold as u32,
                (threshold >> 32) as u32,
                InputScalar::new(mask.scale(), dtype),
                dtype.into(),
            );
        }
        output
    }
}

//! [`EmbeddingBackend`] on burn-cubecl's backend: the lookup is burn's
//! `embedding`; the table gradient three launches, the zeroed table, the
//! sort ([`kernel::plan`]) and the sums ([`kernel::scatter`]).

use burn::tensor::DType;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::{EmbeddingBackend, kernel};

impl<R, F, I, BT> EmbeddingBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn lookup_weight_grad(grad: FloatTensor<Self>, ids: IntTensor<Self>, vocab: usize) -> FloatTensor<Self> {
        let (grad, ids) = (into_contiguous(grad), into_contiguous(ids));
        let hidden = *grad.meta.shape().last().expect("the gradient of a lookup has a hidden dimension");
        let n = ids.meta.shape().num_elements();
        let client = grad.client.clone();
        let output = zeros_client(client.clone(), grad.device.clone(), [vocab, hidden].into(), grad.dtype);
        if n == 0 || hidden == 0 {
            return output;
        }
        let slots =
            || empty_device_contiguous_dtype(client.clone(), grad.device.clone(), [n].into(), DType::U32);
        let (order, head) = (slots(), slots());
        let (float_dtype, int_dtype) = (grad.dtype, ids.dtype);

        let cube_dim = CubeDim::new(&client, n);
        let cube_count = calculate_cube_count_elemwise(&client, n, cube_dim);
        // SAFETY: a thread reads ids below their length only, and writes the
        // place it computes, which counts other tokens and so is below `n`,
        // the length of `order` and `head`.
        unsafe {
            kernel::plan::launch_unchecked::<R>(
                &client,
                cube_count,
                cube_dim,
                ids.clone().into_tensor_arg(),
                order.clone().into_tensor_arg(),
                head.clone().into_tensor_arg(),
                int_dtype.into(),
            );
        }

        let elements = n * hidden;
        let cube_dim = CubeDim::new(&client, elements);
        let cube_count = calculate_cube_count_elemwise(&client, elements, cube_dim);
        // SAFETY: a thread reads `grad` at its own element or at rows of
        // `order`, which are tokens, below `n`; reads `order` within the run
        // `head` gives, which `plan` made of places below `n`; and writes
        // `output` at a row it checked is below `vocab`.
        unsafe {
            kernel::scatter::launch_unchecked::<R>(
                &client,
                cube_count,
                cube_dim,
                grad.into_tensor_arg(),
                ids.into_tensor_arg(),
                order.into_tensor_arg(),
                head.into_tensor_arg(),
                output.clone().into_tensor_arg(),
                hidden as u32,
                vocab as u32,
                [float_dtype.into(), int_dtype.into()],
            );
        }
        output
    }
}

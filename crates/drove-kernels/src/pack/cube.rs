//! [`PackBackend`] on burn-cubecl's backend: one launch of the kernel for
//! each group of at most [`group_size`] parts.

use burn::tensor::ops::FloatTensor;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::calculate_cube_count_elemwise;
use cubecl::prelude::*;

use super::kernel::{self, PER_UNIT};
use super::{MAX_GROUP, PackBackend};

/// The parts one launch takes on a device that binds at most `max_bindings`
/// buffers to a kernel (cubecl's `max_bindings`: on wgpu the adapter's
/// storage buffers per shader stage less the one wgpu keeps): the output and
/// cubecl's buffer of scalars and metadata take two, as burn's fusion counts
/// them; never more than [`MAX_GROUP`], never fewer than one.
pub(crate) fn group_size(max_bindings: u32) -> usize {
    (max_bindings.saturating_sub(2) as usize).clamp(1, MAX_GROUP)
}

impl<R, F, I, BT> PackBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn pack(parts: Vec<FloatTensor<Self>>) -> FloatTensor<Self> {
        let first = parts.first().expect("packing needs a part");
        let (client, device, dtype) = (first.client.clone(), first.device.clone(), first.dtype);
        assert!(parts.iter().all(|p| p.dtype == dtype), "the parts of a pack share a dtype");
        // Empty parts take no place and no binding.
        let parts: Vec<CubeTensor<R>> =
            parts.into_iter().filter(|p| p.meta.num_elements() > 0).map(into_contiguous).collect();
        let total: usize = parts.iter().map(|p| p.meta.num_elements()).sum();
        let output = empty_device_contiguous_dtype(client.clone(), device, [total].into(), dtype);
        let group = group_size(client.properties().hardware.max_bindings);
        let mut to = 0;
        for parts in parts.chunks(group) {
            to = launch(&client, parts, &output, to);
        }
        output
    }
}

/// Units a cube: 256 (the fewest any wgpu adapter allows) is enough for a
/// copy to keep a GPU's memory busy.
const CUBE_UNITS: u32 = 256;

/// One launch copying `parts` into `output` from element `to` on; returns
/// where the next part goes.
fn launch<R: CubeRuntime>(
    client: &ComputeClient<R>,
    parts: &[CubeTensor<R>],
    output: &CubeTensor<R>,
    mut to: usize,
) -> usize {
    let lengths: Vec<usize> = parts.iter().map(|p| p.meta.num_elements()).collect();
    // One size of cube whatever the parts: the cube's size is compiled into
    // the kernel.
    let cube_dim = CubeDim::new_1d(CUBE_UNITS);
    let chunk = cube_dim.num_elems() as usize * PER_UNIT as usize;
    let (mut first_cube, mut offset) = (SequenceArg::<R, u32>::new(), SequenceArg::<R, u32>::new());
    let mut cubes = 0;
    for &length in &lengths {
        first_cube.push(cubes as u32);
        offset.push(to as u32);
        cubes += length.div_ceil(chunk);
        to += length;
    }
    let inputs: SequenceArg<R, _> = parts.iter().map(|p| p.clone().into_tensor_arg()).collect();
    let cube_count = calculate_cube_count_elemwise(client, cubes * cube_dim.num_elems() as usize, cube_dim);
    // SAFETY: a unit reads part `i` at `j` only when `j` is below its length,
    // and writes the output at `offset[i] + j`, which is below `offset[i] +
    // length`, the next part's offset or at most the output's length.
    unsafe {
        kernel::pack::launch_unchecked::<R>(
            client,
            cube_count,
            cube_dim,
            inputs,
            output.clone().into_tensor_arg(),
            first_cube,
            offset,
            output.dtype.into(),
        );
    }
    to
}

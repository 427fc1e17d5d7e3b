//! The CubeCL kernel: a group of parts copied into their slices of the
//! output in one launch.
//!
//! The parts are a [`Sequence`] of tensors, whose length is known when the
//! kernel is compiled, so the loop over them is unrolled and each part is
//! bound as its own buffer. Where each part starts, in the output and in the
//! grid of cubes, are run-time scalars: the kernel is compiled once for each
//! number of parts (and dtype), whatever their sizes.
//!
//! Each cube copies [`PER_UNIT`] times its number of units of one part: the
//! host gives part `i` the cubes from `first_cube[i]`, one for each such
//! chunk of it. A cube finds its part with one comparison a part, the same
//! for all its units (no divergence), and copies its chunk with reads and
//! writes at consecutive addresses.

use cubecl::prelude::*;

/// Elements each unit copies: a cube's chunk is `CUBE_DIM * PER_UNIT`. The
/// search for the cube's part (two comparisons a part) is paid once for
/// these, so that it stays small beside the copy.
pub(crate) const PER_UNIT: u32 = 4;

/// `output[offset[i] + j] = parts[i][j]` for every element `j` of every part
/// `i`. The parts and the output are contiguous; `first_cube[i]` is the first
/// cube of part `i`, which has `ceil(len / (CUBE_DIM * PER_UNIT))` cubes from
/// there, the parts' cubes following each other in order. Cubes past the last
/// part's write nothing.
#[cube(launch_unchecked)]
pub(crate) fn pack<F: Float>(
    parts: &Sequence<Tensor<F>>,
    output: &mut Tensor<F>,
    first_cube: Sequence<u32>,
    offset: Sequence<u32>,
    #[define(F)] _dtype: StorageType,
) {
    let count = comptime!(parts.len());
    let cube = CUBE_POS as u32;
    let chunk = CUBE_DIM * PER_UNIT;
    #[unroll]
    for i in 0..count {
        let start = first_cube[i];
        let part = &parts[i];
        let length = part.len() as u32;
        // A cube of a later part is past this part's end: its base is at or
        // beyond `length` (cubes of earlier parts are below `start`).
        if cube >= start {
            let base = (cube - start) * chunk + UNIT_POS;
            if base < length {
                let to = offset[i];
                #[unroll]
                for k in 0..PER_UNIT {
                    let j = base + k * CUBE_DIM;
                    if j < length {
                        output[(to + j) as usize] = part[j as usize];
                    }
                }
            }
        }
    }
}

//! What the tests on a wgpu adapter share: the device, or a line on stderr
//! saying why there is none and the test passes without running.
#![allow(dead_code)]

use drove_kernels::backends::WgpuDevice;

/// burn's default wgpu device, or `None` after saying why the test skips
/// (a failure under `DROVE_REQUIRE_TOOLS=1`): drove-kernels' `testing`.
pub fn device_or_skip() -> Option<WgpuDevice> {
    drove_kernels::testing::wgpu_device_or_skip()
}

/// The f32 values of a tensor, read back.
pub fn values<B: burn::tensor::backend::Backend, const D: usize>(t: burn::tensor::Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().expect("f32 values")
}

/// The bits of each value, so that equality is bit for bit (0.0 is not -0.0).
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

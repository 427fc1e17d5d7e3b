//! What the tests on a wgpu adapter share: the device, or a line on stderr
//! saying why there is none and the test passes without running.
#![allow(dead_code)]

use std::sync::Once;

use drove_kernels::backends::{WgpuDevice, wgpu_default_device};

/// burn's default wgpu device, or `None` after saying on stderr why the test
/// skips (no Vulkan/Metal/DX12 adapter: `bash scripts/wgpu-tools.sh`
/// installs Mesa's lavapipe as root on Debian).
pub fn device_or_skip() -> Option<WgpuDevice> {
    quiet_mesa();
    let device = wgpu_default_device();
    if device.is_none() {
        eprintln!(
            "skipped: no wgpu adapter (`bash scripts/wgpu-tools.sh` installs Mesa's lavapipe as root on Debian)"
        );
    }
    device
}

/// Points `XDG_RUNTIME_DIR` at a 0700 folder of its own, once a process,
/// before any test opens a device (Mesa warns without one).
fn quiet_mesa() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("drove-kernels-xdg-{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_ok()
            && std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).is_ok()
        {
            // SAFETY: every test calls this before it touches wgpu or Mesa, and
            // `call_once` holds the others here until it returns, so no thread
            // of this process reads the environment while it changes.
            unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
        }
    });
}

/// The f32 values of a tensor, read back.
pub fn values<B: burn::tensor::backend::Backend, const D: usize>(t: burn::tensor::Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().expect("f32 values")
}

/// The bits of each value, so that equality is bit for bit (0.0 is not -0.0).
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

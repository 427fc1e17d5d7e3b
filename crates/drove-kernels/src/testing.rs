//! What tests on a wgpu adapter share (this crate's, drove-bert's): the
//! device, opened once a process with Mesa quiet, or the reason there is none.

use std::sync::OnceLock;

use crate::backends::{WgpuDevice, wgpu_default_device};

/// burn's default wgpu device (Mesa's lavapipe on a machine without a GPU),
/// or `None` after saying on stderr why the calling test skips. Where tools
/// are required (`DROVE_REQUIRE_TOOLS=1`, as scripts/test.sh and CI set) it
/// panics instead, naming what is missing, so that a missing install step
/// cannot turn a test into a pass.
///
/// The first call points `XDG_RUNTIME_DIR` at a 0700 folder of the process's
/// own (Mesa warns without one); every test must call this before it touches
/// wgpu, so that no thread reads the environment while it changes.
pub fn wgpu_device_or_skip() -> Option<WgpuDevice> {
    static FOUND: OnceLock<Option<WgpuDevice>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        quiet_mesa();
        wgpu_default_device()
    });
    if found.is_none() {
        let why = "no wgpu adapter (`bash scripts/wgpu-tools.sh` installs Mesa's lavapipe as root on Debian)";
        assert!(std::env::var("DROVE_REQUIRE_TOOLS").as_deref() != Ok("1"), "this test cannot run: {why}");
        eprintln!("skipped: {why}");
    }
    found.clone()
}

/// Points `XDG_RUNTIME_DIR` at a 0700 folder of this process's own.
fn quiet_mesa() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("drove-wgpu-xdg-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_ok()
        && std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).is_ok()
    {
        // SAFETY: called once, under the OnceLock of `wgpu_device_or_skip`,
        // which every test calls before it touches wgpu or Mesa: no other
        // thread of the process reads the environment meanwhile.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", &dir) };
    }
}

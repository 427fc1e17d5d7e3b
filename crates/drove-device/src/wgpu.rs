//! The wgpu backend (feature `wgpu`): any GPU burn's wgpu reaches through
//! Vulkan, Metal or DX12 (AMD, Intel, Apple, NVIDIA), and Mesa's software
//! Vulkan (lavapipe) on a machine without one.
//!
//! [`Wgpu`] is burn-cubecl over cubecl-wgpu without fusion or autotune (their
//! first step costs minutes of shader compiles on lavapipe and buys nothing on
//! a correctness path). drove lists the adapters itself ([`adapters`]) and
//! opens the one asked for ([`open_adapter`]) with the device request
//! cubecl-wgpu makes, so that every way this can fail is an error naming it:
//! no Vulkan loader, no adapter, an index past the list, a device that cannot
//! be created. cubecl-wgpu would panic on each instead. A device lost later
//! (a driver reset, a GPU unplugged) is recorded by its callback and named by
//! [`OpenedAdapter::failure`], so the caller's error says why the device
//! stopped; [`catch_quietly`] turns the panics burn and cubecl raise then into
//! an error.
//!
//! Gradients leave the device through host staging
//! ([`HostStaging`](crate::HostStaging)), averaged by the
//! [`Collective`](drove_collective::Collective) as Horovod does without NCCL.

use std::fmt;
use std::sync::{Arc, Mutex};

use cubecl::wgpu::{AutoGraphicsApi, GraphicsApi, RuntimeOptions, WgpuSetup};

use crate::DeviceError;

/// burn's wgpu backend without fusion: f32 floats, i32 ints, u32 bools.
pub type Wgpu = drove_kernels::backends::Wgpu;
/// A wgpu device as burn names it ([`open_adapter`] gives an `Existing` one).
pub use cubecl::wgpu::WgpuDevice;
/// The graphics API of an adapter, and its kind (wgpu's types).
pub use wgpu::{Backend as GraphicsBackend, DeviceType};

/// The Vulkan loader's library name, which wgpu loads at run time.
#[cfg(all(unix, not(target_os = "macos")))]
const VULKAN_LOADER: &str = "libvulkan.so.1";

/// One adapter wgpu found: a GPU (or a software rasteriser) and its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    /// Its place in [`adapters`]' list: `--device wgpu:N`.
    pub index: usize,
    /// The device's name, e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`.
    pub name: String,
    /// The driver's name and version, e.g. `llvmpipe`, `Mesa 22.3.6 (LLVM 15.0.6)`.
    pub driver: String,
    /// Discrete, integrated, virtual, CPU or other.
    pub device_type: DeviceType,
    /// Vulkan, Metal, DX12, ...
    pub backend: GraphicsBackend,
}

impl Adapter {
    fn new(index: usize, info: wgpu::AdapterInfo) -> Adapter {
        let driver = match (info.driver.trim(), info.driver_info.trim()) {
            ("", "") => "unknown driver".to_string(),
            (d, "") | ("", d) => d.to_string(),
            (d, i) => format!("{d} {i}"),
        };
        Adapter { index, name: info.name, driver, device_type: info.device_type, backend: info.backend }
    }
}

impl fmt::Display for Adapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "wgpu:{} {} ({:?}, {:?}, driver {})",
            self.index, self.name, self.device_type, self.backend, self.driver
        )
    }
}

/// The adapters list, one a line, for an error or `--device help`.
pub fn describe(adapters: &[Adapter]) -> String {
    if adapters.is_empty() {
        return "none".into();
    }
    adapters.iter().map(|a| format!("\n  {a}")).collect()
}

/// Every adapter wgpu finds for the platform's graphics API (Vulkan on
/// Linux and Windows, Metal on macOS), in wgpu's order: `wgpu:N` is the N-th.
/// An error names a missing Vulkan loader; an empty list is no error here.
pub fn adapters() -> Result<Vec<Adapter>, DeviceError> {
    let (_, found) = enumerate()?;
    Ok(found.into_iter().enumerate().map(|(i, a)| Adapter::new(i, a.get_info())).collect())
}

fn enumerate() -> Result<(wgpu::Instance, Vec<wgpu::Adapter>), DeviceError> {
    check_loader()?;
    let backend = AutoGraphicsApi::backend();
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: backend.into(),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let found = cubecl::future::block_on(instance.enumerate_adapters(backend.into()));
    Ok((instance, found))
}

/// Whether the Vulkan loader can be loaded (wgpu skips Vulkan silently when it
/// cannot, which would read as "no adapter").
fn check_loader() -> Result<(), DeviceError> {
    #[cfg(all(unix, not(target_os = "macos")))]
    {
        let name = std::ffi::CString::new(VULKAN_LOADER).expect("no NUL in the name");
        // SAFETY: dlopen/dlclose of a library by name, no symbol used; wgpu
        // loads the same library to use Vulkan at all.
        let found = unsafe {
            let handle = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if !handle.is_null() {
                libc::dlclose(handle);
            }
            !handle.is_null()
        };
        if !found {
            return Err(DeviceError::Gpu(format!(
                "no Vulkan loader: {VULKAN_LOADER} cannot be loaded, so wgpu sees no GPU. Install it with your \
                 GPU's driver (Debian/Ubuntu: libvulkan1 and, for a GPU, its vendor's Vulkan driver; without a \
                 GPU, mesa-vulkan-drivers gives Mesa's software Vulkan), or put its folder on LD_LIBRARY_PATH; \
                 --device cpu trains without a GPU"
            )));
        }
    }
    Ok(())
}

/// Why this process's device was lost, once wgpu's callback said so.
static LOST: Mutex<Option<String>> = Mutex::new(None);
/// The first error wgpu reported outside any call (a validation error, an
/// out-of-memory), kept for the error of the call that fails with it.
static REPORTED: Mutex<Option<String>> = Mutex::new(None);

/// wgpu's messages run over several indented lines: one line for an error.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An adapter opened for training: burn's device for it, and wgpu's device
/// underneath (to lose it on purpose in a test).
#[derive(Clone, Debug)]
pub struct OpenedAdapter {
    /// burn's device: `WgpuDevice::Existing`.
    pub device: WgpuDevice,
    /// What was opened.
    pub adapter: Adapter,
    raw: wgpu::Device,
}

impl OpenedAdapter {
    /// Destroys the wgpu device, as a driver reset would: every later
    /// operation on it fails. For tests of the device-lost path.
    pub fn destroy(&self) {
        self.raw.destroy();
    }

    /// Why the device stopped working, if wgpu said: lost (its callback,
    /// which a poll of the device delivers), else the first error it
    /// reported outside a call. For the error of the operation that failed.
    pub fn failure(&self) -> Option<String> {
        // Delivers a pending device-lost callback; its own error is the same loss.
        let _ = self.raw.poll(wgpu::PollType::Poll);
        let read = |m: &Mutex<Option<String>>| m.lock().map(|l| l.clone()).unwrap_or(None);
        read(&LOST).or_else(|| read(&REPORTED))
    }
}

/// How many [`catch_quietly`] calls are running: while any is, a panic is
/// recorded for its error instead of printed.
static QUIET: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// The first panic recorded while quiet: its message and where it was raised.
static PANICKED: Mutex<Option<String>> = Mutex::new(None);

/// Runs `f`, catching a panic inside burn, cubecl or wgpu (how they report a
/// lost device or a failed kernel, on this thread or on a thread `f` scoped)
/// without printing it: `Err` holds the first panic's message and place, for
/// an error that names the device. Panics outside stay as loud as before.
pub fn catch_quietly<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    use std::sync::atomic::Ordering;
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let loud = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if QUIET.load(Ordering::SeqCst) == 0 {
                return loud(info);
            }
            let message = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            let place =
                info.location().map(|l| format!(" (at {}:{})", l.file(), l.line())).unwrap_or_default();
            if let Ok(mut first) = PANICKED.lock() {
                first.get_or_insert(format!("{}{place}", one_line(&message)));
            }
        }));
    });
    QUIET.fetch_add(1, Ordering::SeqCst);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.fetch_sub(1, Ordering::SeqCst);
    caught.map_err(|_| {
        PANICKED.lock().ok().and_then(|mut p| p.take()).unwrap_or_else(|| "a panic without a message".into())
    })
}

/// Opens adapter `index` of [`adapters`] for burn: checks the loader, finds
/// the adapter (an error lists those found when there is none or `index` is
/// past them), requests a device with the features and limits cubecl-wgpu
/// asks for, and registers it with cubecl. Nothing panics on the way.
pub fn open_adapter(index: usize) -> Result<OpenedAdapter, DeviceError> {
    let (instance, mut found) = enumerate()?;
    let listed: Vec<Adapter> = found.iter().enumerate().map(|(i, a)| Adapter::new(i, a.get_info())).collect();
    let backend = AutoGraphicsApi::backend();
    if found.is_empty() {
        return Err(DeviceError::Gpu(format!(
            "no wgpu adapter: the Vulkan loader is there but finds no {backend:?} device (no GPU driver with \
             {backend:?} support, or VK_ICD_FILENAMES names none). Install your GPU's Vulkan driver, or \
             mesa-vulkan-drivers for Mesa's software Vulkan (lavapipe: slow, for checking); --device cpu trains \
             without a GPU"
        )));
    }
    if index >= found.len() {
        return Err(DeviceError::Gpu(format!(
            "wgpu adapter {index} was asked for but wgpu finds {} adapter(s):{}\nname one with --device wgpu:N",
            found.len(),
            describe(&listed)
        )));
    }
    let adapter = found.swap_remove(index);
    let chosen = listed[index].clone();
    let limits = adapter.limits();
    // cubecl-wgpu's own request (its WGSL path), as a Result instead of a panic.
    let requested = cubecl::future::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("drove"),
        required_features: adapter.features().difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
        required_limits: limits,
        memory_hints: wgpu::MemoryHints::MemoryUsage,
        trace: wgpu::Trace::Off,
        // SAFETY: as cubecl-wgpu asks (it may use passthrough shaders).
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
    }));
    let (device, queue) =
        requested.map_err(|e| DeviceError::Gpu(format!("opening {chosen}: wgpu refused the device: {e}")))?;
    let name = chosen.to_string();
    device.set_device_lost_callback(move |reason, message| {
        let why = match one_line(&message) {
            m if m.is_empty() => String::new(),
            m => format!(": {m}"),
        };
        if let Ok(mut lost) = LOST.lock() {
            *lost = Some(format!("{name} was lost ({reason:?}){why}"));
        }
    });
    // An error wgpu reports outside any call (a validation error, an
    // out-of-memory) is kept for the failing call's error, never a panic on
    // wgpu's thread.
    device.on_uncaptured_error(Arc::new(|error: wgpu::Error| {
        if let Ok(mut reported) = REPORTED.lock() {
            reported.get_or_insert_with(|| format!("wgpu reported: {}", one_line(&error.to_string())));
        }
    }));
    let raw = device.clone();
    let setup = WgpuSetup { instance, adapter, device, queue, backend };
    let device = cubecl::wgpu::init_device(setup, RuntimeOptions::default());
    Ok(OpenedAdapter { device, adapter: chosen, raw })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapter_reads_as_its_number_name_kind_and_driver() {
        let a = Adapter {
            index: 1,
            name: "llvmpipe (LLVM 15.0.6, 256 bits)".into(),
            driver: "llvmpipe Mesa 22.3.6".into(),
            device_type: DeviceType::Cpu,
            backend: GraphicsBackend::Vulkan,
        };
        assert_eq!(
            a.to_string(),
            "wgpu:1 llvmpipe (LLVM 15.0.6, 256 bits) (Cpu, Vulkan, driver llvmpipe Mesa 22.3.6)"
        );
        assert_eq!(describe(&[]), "none");
        assert_eq!(describe(std::slice::from_ref(&a)), format!("\n  {a}"));
    }
}

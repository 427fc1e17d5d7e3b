//! Raw device memory for the GPU benchmarks (feature `cuda`): an allocation that
//! is freed on every path, and the device-to-device copy that the NCCL suite
//! is compared with. Every call needs a CUDA context current on the calling
//! thread (as after `drove_nccl::Nccl::new`).

use std::time::Instant;

use cudarc::driver::result as cu;
use cudarc::driver::sys::CUstream;

use crate::DeviceError;

/// A driver call's failure, named.
fn failed(call: &'static str) -> impl FnOnce(cu::DriverError) -> DeviceError {
    move |e| DeviceError::Gpu(format!("{call}: {e:?}"))
}

/// A device allocation of `bytes`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` on the current context's device (not initialised).
    pub fn new(bytes: usize) -> Result<DeviceBuffer, DeviceError> {
        // SAFETY: a fresh allocation, owned by the guard from here on.
        let ptr = unsafe { cu::malloc_sync(bytes) }.map_err(failed("cuMemAlloc"))?;
        Ok(DeviceBuffer { ptr, bytes })
    }

    /// Allocates `bytes`, every one zero.
    pub fn zeroed(bytes: usize) -> Result<DeviceBuffer, DeviceError> {
        let buffer = DeviceBuffer::new(bytes)?;
        // SAFETY: the whole of our own allocation, used by nothing else yet.
        unsafe { cu::memset_d8_sync(buffer.ptr, 0, bytes) }.map_err(failed("cuMemsetD8"))?;
        Ok(buffer)
    }

    /// Its device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Its bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: an allocation of ours, no longer used.
        let _ = unsafe { cu::free_sync(self.ptr) };
    }
}

/// Seconds to copy all of `from` into `to` on `stream`, waiting for it.
///
/// # Safety
///
/// `stream` is a live stream of the current context, with no work queued
/// that uses either buffer.
pub unsafe fn copy_seconds(
    to: &DeviceBuffer,
    from: &DeviceBuffer,
    stream: CUstream,
) -> Result<f64, DeviceError> {
    let bytes = from.bytes.min(to.bytes);
    let t = Instant::now();
    // SAFETY: both allocations hold `bytes`; the caller vouches for the stream.
    unsafe {
        cu::memcpy_dtod_async(to.ptr, from.ptr, bytes, stream).map_err(failed("cuMemcpyDtoDAsync"))?;
        cu::stream::synchronize(stream).map_err(failed("cuStreamSynchronize"))?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The name of GPU `ordinal`, from the driver.
pub fn device_name(ordinal: usize) -> Result<String, DeviceError> {
    let dev = cu::device::get(ordinal as i32).map_err(failed("cuDeviceGet"))?;
    cu::device::get_name(dev).map_err(failed("cuDeviceGetName"))
}

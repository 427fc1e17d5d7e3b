//! [`Nccl`]: the real device, NCCL through `cudarc::nccl::result` on a
//! non-blocking communicator and a CUDA stream of its own.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use cudarc::driver::{result as cu, sys as cusys};
use cudarc::nccl::{result as nccl, sys};
use drove_collective::{DType, ReduceOp};

use crate::device::{Device, DeviceCall, GpuLibraryError, UniqueId};

/// The libraries a device communicator needs, loaded the way cudarc loads
/// them; the first that cannot be is named with what to install or set. A
/// missing library would otherwise panic inside cudarc on first use.
pub fn require_libraries() -> Result<(), GpuLibraryError> {
    // SAFETY: loading a shared library by name runs its initialisers, which
    // for the CUDA driver and NCCL are what using them does anyway.
    if !unsafe { cusys::is_culib_present() } {
        return Err(GpuLibraryError::MissingLibrary {
            library: "libcuda.so",
            hint:
                "the NVIDIA driver's library is not on this machine (no GPU driver installed): install the \
                   NVIDIA driver, or run the container with the GPU exposed (--gpus all, or a \
                   nvidia.com/gpu resource), or put the folder holding libcuda.so on LD_LIBRARY_PATH"
                    .into(),
        });
    }
    // SAFETY: as above.
    if !unsafe { sys::is_culib_present() } {
        let soname_only = libloading_present("libnccl.so.2");
        return Err(GpuLibraryError::MissingLibrary {
            library: "libnccl.so",
            hint: if soname_only {
                "libnccl.so.2 is loadable but cudarc opens libnccl.so: create the link \
                 `ln -s /path/to/libnccl.so.2 DIR/libnccl.so` in a folder DIR on LD_LIBRARY_PATH"
                    .into()
            } else {
                "install NCCL (Debian/Ubuntu: libnccl2 and libnccl-dev; pip: nvidia-nccl-cu13, whose lib/ \
                 folder needs a libnccl.so -> libnccl.so.2 link) and put its folder on LD_LIBRARY_PATH"
                    .into()
            },
        });
    }
    Ok(())
}

fn libloading_present(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else { return false };
    // SAFETY: dlopen/dlclose of a library by name; no symbol is used.
    unsafe {
        let handle = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY);
        if handle.is_null() {
            return false;
        }
        libc::dlclose(handle);
    }
    true
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Joining,
    Running,
}

/// One rank's NCCL device: a non-blocking communicator on GPU `ordinal`, a
/// stream of its own, and a 4-byte scratch buffer for barriers.
///
/// Ordering with other work on the GPU (burn's kernels run on a stream private
/// to burn) is the caller's: sync the producing work before an op; an op is
/// finished on the device when [`DeviceComm`](crate::DeviceComm) returns.
pub struct Nccl {
    ordinal: usize,
    ctx: cusys::CUcontext,
    stream: cusys::CUstream,
    comm: sys::ncclComm_t,
    scratch: cusys::CUdeviceptr,
    phase: Phase,
    aborted: bool,
    version: c_int,
}

// SAFETY: the raw handles are used only through `&mut self` (one thread at a
// time), and every method makes the context current on the calling thread.
unsafe impl Send for Nccl {}

fn driver(call: &str) -> impl Fn(cu::DriverError) -> GpuLibraryError + '_ {
    move |e| GpuLibraryError::call(call, format!("{e:?}"))
}

fn nccl_error(call: &'static str) -> impl Fn(nccl::NcclError) -> GpuLibraryError {
    move |e| GpuLibraryError::call(call, format!("{:?}", e.0))
}

impl Nccl {
    /// Opens GPU `ordinal` (its primary context, the one burn's CUDA backend
    /// also uses) after checking that libcuda and libnccl load.
    pub fn new(ordinal: usize) -> Result<Nccl, GpuLibraryError> {
        require_libraries()?;
        cu::init().map_err(driver("cuInit"))?;
        let count = cu::device::get_count().map_err(driver("cuDeviceGetCount"))?;
        if ordinal >= count as usize {
            return Err(GpuLibraryError::call(
                "cuDeviceGet",
                format!("GPU {ordinal} asked for but this machine shows {count} (CUDA_VISIBLE_DEVICES?)"),
            ));
        }
        let dev = cu::device::get(ordinal as c_int).map_err(driver("cuDeviceGet"))?;
        // SAFETY: `dev` is a valid device; the primary context is retained for
        // the life of `Nccl` and released in `drop`.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(driver("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: `ctx` is a live context.
        unsafe { cu::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))?;
        let stream =
            cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(driver("cuStreamCreate"))?;
        // SAFETY: a fresh 4-byte allocation, zeroed before use.
        let scratch = unsafe {
            let p = cu::malloc_sync(4).map_err(driver("cuMemAlloc"))?;
            cu::memset_d8_sync(p, 0, 4).map_err(driver("cuMemsetD8"))?;
            p
        };
        let version = nccl::get_nccl_version().map_err(nccl_error("ncclGetVersion"))?;
        Ok(Nccl {
            ordinal,
            ctx,
            stream,
            comm: std::ptr::null_mut(),
            scratch,
            phase: Phase::Idle,
            aborted: false,
            version,
        })
    }

    /// The CUDA stream NCCL runs on (a `CUstream`).
    pub fn stream(&self) -> u64 {
        self.stream as u64
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn current(&self) -> Result<(), GpuLibraryError> {
        // SAFETY: `ctx` is retained by `self`.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(driver("cuCtxSetCurrent"))
    }

    fn nccl_stream(&self) -> sys::cudaStream_t {
        self.stream as sys::cudaStream_t
    }

    /// `ncclCommGetAsyncError`: `Ok(true)` when the communicator is idle and
    /// well, `Ok(false)` while a call is still being enqueued.
    fn async_state(&self) -> Result<bool, GpuLibraryError> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is a live communicator; `state` is a valid out pointer.
        unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) }
            .result()
            .map_err(nccl_error("ncclCommGetAsyncError"))?;
        match state.result() {
            Ok(nccl::NcclStatus::InProgress) => Ok(false),
            Ok(_) => Ok(true),
            Err(e) => Err(GpuLibraryError::call("NCCL (asynchronous error)", format!("{:?}", e.0))),
        }
    }
}

fn nccl_dtype(dtype: DType) -> sys::ncclDataType_t {
    match dtype {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Average => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
        ReduceOp::Product => sys::ncclRedOp_t::ncclProd,
    }
}

/// Fills `out` with a non-blocking config and returns the pointer NCCL reads.
///
/// Every byte is zeroed first, padding included (the 4 bytes after
/// `maxP2pPeers` are a field, `graphStreamOrdering`, in NCCL 2.31 and later),
/// then each field is written in place: a struct literal would leave its
/// padding undefined, and a copy of it need not keep the zeros. Every field
/// NCCL's initializer leaves unset is `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`) or
/// null, as `NCCL_CONFIG_INITIALIZER` writes it; the version is the loaded
/// library's, at most that of the header cudarc's bindings were made from
/// (2.30), so NCCL reads no field the struct does not have.
fn config(out: &mut MaybeUninit<sys::ncclConfig_t>, version: c_int) -> *mut sys::ncclConfig_t {
    const UNDEF: c_int = c_int::MIN;
    let c = out.as_mut_ptr();
    // SAFETY: `c` points to writable memory of the struct's size; the struct
    // is integers and raw pointers, for which all-zero bytes are a valid value,
    // and each field is assigned in place (no read of the old value, no copy).
    unsafe {
        std::ptr::write_bytes(c, 0, 1);
        (*c).size = std::mem::size_of::<sys::ncclConfig_t>();
        (*c).magic = 0xcafe_beef;
        (*c).version = version.clamp(0, 23000) as u32;
        (*c).blocking = 0;
        (*c).cgaClusterSize = UNDEF;
        (*c).minCTAs = UNDEF;
        (*c).maxCTAs = UNDEF;
        (*c).netName = std::ptr::null();
        (*c).splitShare = UNDEF;
        (*c).trafficClass = UNDEF;
        (*c).commName = std::ptr::null();
        (*c).collnetEnable = UNDEF;
        (*c).CTAPolicy = UNDEF;
        (*c).shrinkShare = UNDEF;
        (*c).nvlsCTAs = UNDEF;
        (*c).nChannelsPerNetPeer = UNDEF;
        (*c).nvlinkCentricSched = UNDEF;
        (*c).graphUsageMode = UNDEF;
        (*c).numRmaCtx = UNDEF;
        (*c).maxP2pPeers = UNDEF;
    }
    c
}

impl Device for Nccl {
    fn unique_id(&mut self) -> Result<UniqueId, GpuLibraryError> {
        let id = nccl::get_uniqueid().map_err(nccl_error("ncclGetUniqueId"))?;
        let mut out = [0u8; 128];
        for (o, c) in out.iter_mut().zip(id.internal.iter()) {
            *o = *c as u8;
        }
        Ok(UniqueId(out))
    }

    fn init(&mut self, id: &UniqueId, world: usize, rank: usize) -> Result<(), GpuLibraryError> {
        self.current()?;
        let mut raw = sys::ncclUniqueId { internal: [0; 128] };
        for (r, b) in raw.internal.iter_mut().zip(id.0.iter()) {
            *r = *b as std::ffi::c_char;
        }
        let mut cfg = MaybeUninit::uninit();
        let cfg = config(&mut cfg, self.version);
        // SAFETY: valid out pointer and a config filled in place (it outlives
        // the call); the id came from ncclGetUniqueId.
        unsafe { nccl::comm_init_rank_config(&mut self.comm, world as c_int, raw, rank as c_int, cfg) }
            .map_err(nccl_error("ncclCommInitRankConfig"))?;
        self.phase = Phase::Joining;
        Ok(())
    }

    unsafe fn launch(&mut self, call: &DeviceCall) -> Result<(), GpuLibraryError> {
        if self.aborted || self.comm.is_null() {
            return Err(GpuLibraryError::call("NCCL", "the communicator is not joined or was aborted"));
        }
        self.current()?;
        let (comm, stream) = (self.comm, self.nccl_stream());
        let p = |a: u64| a as *mut c_void;
        // SAFETY: the caller's contract on the addresses; `comm` and `stream` are live.
        let r = unsafe {
            match *call {
                DeviceCall::AllReduce { send, recv, count, dtype, op } => {
                    nccl::all_reduce(p(send), p(recv), count, nccl_dtype(dtype), nccl_op(op), comm, stream)
                }
                DeviceCall::Broadcast { send, recv, count, dtype, root } => {
                    nccl::broadcast(p(send), p(recv), count, nccl_dtype(dtype), root as c_int, comm, stream)
                }
                DeviceCall::AllGather { send, recv, count, dtype } => {
                    nccl::all_gather(p(send), p(recv), count, nccl_dtype(dtype), comm, stream)
                }
                DeviceCall::ReduceScatter { send, recv, count, dtype, op } => nccl::reduce_scatter(
                    p(send),
                    p(recv),
                    count,
                    nccl_dtype(dtype),
                    nccl_op(op),
                    comm,
                    stream,
                ),
                DeviceCall::Barrier => nccl::all_reduce(
                    p(self.scratch),
                    p(self.scratch),
                    1,
                    sys::ncclDataType_t::ncclInt32,
                    sys::ncclRedOp_t::ncclSum,
                    comm,
                    stream,
                ),
            }
        };
        r.map_err(nccl_error("NCCL collective"))?;
        self.phase = Phase::Running;
        Ok(())
    }

    fn poll(&mut self) -> Result<bool, GpuLibraryError> {
        match self.phase {
            Phase::Idle => Ok(true),
            Phase::Joining => {
                let done = self.async_state()?;
                if done {
                    self.phase = Phase::Idle;
                }
                Ok(done)
            }
            Phase::Running => {
                if !self.async_state()? {
                    return Ok(false);
                }
                self.current()?;
                // SAFETY: `stream` is live.
                match unsafe { cusys::cuStreamQuery(self.stream) } {
                    cusys::CUresult::CUDA_SUCCESS => {
                        self.phase = Phase::Idle;
                        Ok(true)
                    }
                    cusys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                    other => Err(GpuLibraryError::call("cuStreamQuery", format!("{other:?}"))),
                }
            }
        }
    }

    fn abort(&mut self) {
        if !self.comm.is_null() && !self.aborted {
            // SAFETY: `comm` is live; abort ends pending work and frees it.
            if let Err(e) = unsafe { nccl::comm_abort(self.comm) } {
                tracing::warn!("ncclCommAbort on GPU {}: {:?}", self.ordinal, e.0);
            }
            self.aborted = true;
        }
        self.phase = Phase::Idle;
    }

    fn describe(&self) -> String {
        let v = self.version;
        format!("NCCL {}.{}.{} on cuda:{}", v / 10000, (v / 100) % 100, v % 100, self.ordinal)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        let _ = self.current();
        if !self.comm.is_null() && !self.aborted {
            // A non-blocking communicator is finalized, polled, then destroyed;
            // one that does not finish within 10 s is aborted instead.
            // SAFETY: `comm` is live and idle (every op was waited for).
            let finalized = unsafe { nccl::comm_finalize(self.comm) }.is_ok() && {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match self.async_state() {
                        Ok(true) => break true,
                        Ok(false) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(1))
                        }
                        _ => break false,
                    }
                }
            };
            // SAFETY: as above; after destroy or abort `comm` is not used again.
            unsafe {
                if finalized {
                    let _ = nccl::comm_destroy(self.comm);
                } else {
                    let _ = nccl::comm_abort(self.comm);
                }
            }
        }
        // SAFETY: the stream and scratch buffer are ours, the context retained by us.
        unsafe {
            let _ = cu::stream::destroy(self.stream);
            let _ = cu::free_sync(self.scratch);
            if let Ok(dev) = cu::device::get(self.ordinal as c_int) {
                let _ = cu::primary_ctx::release(dev);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{MaybeUninit, offset_of, size_of};

    use super::{config, sys};

    /// The byte ranges of `ncclConfig_t`'s fields, from the compiler's layout.
    fn fields() -> Vec<(&'static str, usize, usize)> {
        use std::ffi::{c_char, c_int, c_uint};
        type C = sys::ncclConfig_t;
        let (int, ptr) = (size_of::<c_int>(), size_of::<*const c_char>());
        vec![
            ("size", offset_of!(C, size), size_of::<usize>()),
            ("magic", offset_of!(C, magic), size_of::<c_uint>()),
            ("version", offset_of!(C, version), size_of::<c_uint>()),
            ("blocking", offset_of!(C, blocking), int),
            ("cgaClusterSize", offset_of!(C, cgaClusterSize), int),
            ("minCTAs", offset_of!(C, minCTAs), int),
            ("maxCTAs", offset_of!(C, maxCTAs), int),
            ("netName", offset_of!(C, netName), ptr),
            ("splitShare", offset_of!(C, splitShare), int),
            ("trafficClass", offset_of!(C, trafficClass), int),
            ("commName", offset_of!(C, commName), ptr),
            ("collnetEnable", offset_of!(C, collnetEnable), int),
            ("CTAPolicy", offset_of!(C, CTAPolicy), int),
            ("shrinkShare", offset_of!(C, shrinkShare), int),
            ("nvlsCTAs", offset_of!(C, nvlsCTAs), int),
            ("nChannelsPerNetPeer", offset_of!(C, nChannelsPerNetPeer), int),
            ("nvlinkCentricSched", offset_of!(C, nvlinkCentricSched), int),
            ("graphUsageMode", offset_of!(C, graphUsageMode), int),
            ("numRmaCtx", offset_of!(C, numRmaCtx), int),
            ("maxP2pPeers", offset_of!(C, maxP2pPeers), int),
        ]
    }

    #[test]
    fn the_config_has_zero_padding_and_the_initializer_values() {
        let size = size_of::<sys::ncclConfig_t>();
        let mut covered = vec![None; size];
        for (name, at, len) in fields() {
            for b in &mut covered[at..at + len] {
                assert!(b.is_none(), "{name} overlaps another field");
                *b = Some(name);
            }
        }
        let padding: Vec<usize> = (0..size).filter(|&i| covered[i].is_none()).collect();
        // The struct has padding (after maxP2pPeers), so the check below can fail.
        assert_eq!(padding, vec![92, 93, 94, 95], "ncclConfig_t's padding moved: check the field list");

        // Memory full of 0xAA, as a stack slot may be: `config` must clear it.
        let mut slot = MaybeUninit::<sys::ncclConfig_t>::uninit();
        // SAFETY: writes bytes into memory we own.
        unsafe { std::ptr::write_bytes(slot.as_mut_ptr().cast::<u8>(), 0xaa, size) };
        let ptr = config(&mut slot, 23203);
        // SAFETY: `config` initialised every byte of the slot.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), size) };
        for &i in &padding {
            assert_eq!(bytes[i], 0, "padding byte {i} is {:#04x}, not zero", bytes[i]);
        }
        // SAFETY: as above.
        let c = unsafe { slot.assume_init() };
        assert_eq!((c.size, c.magic, c.version, c.blocking), (size, 0xcafe_beef, 23000, 0));
        assert_eq!((c.minCTAs, c.maxP2pPeers), (i32::MIN, i32::MIN));
        assert!(c.netName.is_null() && c.commName.is_null());
        let older = config(&mut slot, 22809);
        // SAFETY: initialised by `config`.
        assert_eq!(unsafe { (*older).version }, 22809, "an older library gets its own version");
    }
}

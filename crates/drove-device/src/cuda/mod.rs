//! The CUDA backend (feature `cuda`): burn's operation fusion over
//! burn-cubecl over cubecl-cuda ([`Cuda`]; autotune with feature `autotune`),
//! the kernel cache kept on disk between runs ([`crate::kernels`]), a check
//! that the libraries it loads at run time are there, the device memory of a
//! tensor ([`device_memory`], through fusion to the cubecl tensor), and (feature `nccl`)
//! [`NcclBuckets`], the in-place device all-reduce of gradient buckets, with
//! [`check_in_place`], the GPU check's proof that it reduces the bytes it
//! should.
//!
//! A missing `libcuda`, `libnvrtc` or CUDA header folder would otherwise panic
//! inside cudarc or on burn's device thread; [`open_gpu`] names the missing
//! piece and what to install or set instead.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_fusion::{FusionTensor, NoOp};
use cubecl::cuda::CudaRuntime;

use crate::DeviceError;

/// burn's CUDA backend under fusion: f32 floats, i32 ints, u8 bools. Chains
/// of element-wise operations (AdamW's, GELU's, LayerNorm's) run as one
/// kernel each, which at batch 32 decides the speed: a step is launch-bound.
pub type Cuda = drove_kernels::backends::Cuda;
/// The cubecl backend [`Cuda`] fuses over, whose tensors' device memory can
/// be reached.
pub type CudaCube = drove_kernels::backends::CudaCube;
/// A GPU as burn names it.
pub use cubecl::cuda::CudaDevice;

fn missing(library: &str, hint: &str) -> DeviceError {
    DeviceError::Gpu(format!("{library} cannot be loaded: {hint}"))
}

/// Checks that training can run on GPU `ordinal` (libcuda and a driver that
/// shows the GPU, libnvrtc, the CUDA headers NVRTC compiles against) and
/// returns burn's device for it. Nothing is touched before the checks pass,
/// so a machine without a GPU gets this error and no panic.
pub fn open_gpu(ordinal: usize) -> Result<CudaDevice, DeviceError> {
    // SAFETY: loading shared libraries by name runs their initialisers, which
    // for the CUDA driver and NVRTC is what using them does anyway.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(missing(
            "libcuda.so",
            "the NVIDIA driver's library is not on this machine (no GPU driver installed): install the NVIDIA \
             driver, or run the container with the GPU exposed (--gpus all, or a nvidia.com/gpu resource), or \
             put the folder holding libcuda.so on LD_LIBRARY_PATH; --device cpu trains without a GPU",
        ));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(missing(
            "libnvrtc.so",
            "the CUDA runtime compiler is needed to build burn's kernels: install the CUDA toolkit's NVRTC \
             (Debian/Ubuntu: cuda-nvrtc-13-0; pip: nvidia-cuda-nvrtc) and put its lib folder on LD_LIBRARY_PATH",
        ));
    }
    match cubecl::cuda::install::cuda_path() {
        Some(root) if root.join("include").join("cuda.h").exists() => {}
        found => {
            return Err(DeviceError::Gpu(format!(
                "the CUDA headers NVRTC compiles burn's kernels against are missing ({}): install the CUDA \
                 toolkit's headers and set CUDA_PATH to the folder holding include/cuda.h",
                match found {
                    Some(root) => format!("no {}", root.join("include").join("cuda.h").display()),
                    None => "CUDA_PATH is unset and there is no /usr/local/cuda, /opt/cuda or /usr/bin/nvcc"
                        .into(),
                }
            )));
        }
    }
    let driver = |what: &str, e: cudarc::driver::DriverError| DeviceError::Gpu(format!("{what}: {e:?}"));
    cudarc::driver::result::init().map_err(|e| driver("initialising the CUDA driver (cuInit)", e))?;
    let count = cudarc::driver::result::device::get_count().map_err(|e| driver("counting GPUs", e))? as usize;
    if ordinal >= count {
        return Err(DeviceError::Gpu(format!(
            "GPU {ordinal} was asked for but this process sees {count} GPU(s) (CUDA_VISIBLE_DEVICES={}); \
             under `drove run` each rank takes the GPU of its local rank: start at most {count} rank(s) per \
             host, or name one with --device cuda:N",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        )));
    }
    Ok(CudaDevice::new(ordinal))
}

/// Waits for every kernel burn queued on `device` (a host sync).
pub fn sync(device: &CudaDevice) -> Result<(), DeviceError> {
    <Cuda as Backend>::sync(device).map_err(|e| DeviceError::Gpu(format!("waiting for the GPU: {e:?}")))
}

/// How [`device_memory`] reached a tensor's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// The tensor's own contiguous buffer (or its own view at an offset into
    /// one): used where it lies.
    InPlace,
    /// The buffer is shared with another tensor (a clone, or the other pieces
    /// of a `split`): copied first, so that writing it leaves the others as
    /// they are.
    CopiedShared,
    /// Laid out with strides (a broadcast by `expand`, for one): made
    /// contiguous first.
    CopiedStrided,
}

/// A 1-D tensor's device memory, as [`device_memory`] found it.
pub struct DeviceMemory {
    /// The tensor that owns the memory: the one given, or its copy.
    pub tensor: Tensor<Cuda, 1>,
    /// Device address of its first element (the view's offset applied).
    pub ptr: u64,
    /// Elements.
    pub len: usize,
    /// Byte offset of the tensor's first element into its buffer.
    pub offset_bytes: u64,
    /// Whether a copy was made, and why.
    pub access: Access,
}

/// A 1-D tensor's device memory, after a copy if burn shares its buffer or
/// lays it out with strides; the returned tensor owns the memory.
///
/// The address is read with `get_resource`, which applies the view's offset;
/// burn 0.21 has no way to order a foreign stream after its own, so the
/// caller syncs (see [`sync`]) before other work touches it.
pub fn device_memory(tensor: Tensor<Cuda, 1>) -> Result<DeviceMemory, DeviceError> {
    let len = tensor.dims()[0];
    let fused = tensor.into_primitive().tensor();
    // Runs the fused work the tensor waits on, then hands its cubecl tensor over.
    let mut prim: CubeTensor<CudaRuntime> = fused.client.clone().resolve_tensor_float::<CudaCube>(fused);
    let mut access = Access::InPlace;
    if !prim.can_mut() {
        // Shared with another tensor: writing in place would change it too.
        let copy = Tensor::<CudaCube, 1>::from_primitive(TensorPrimitive::Float(prim)).mul_scalar(1.0);
        prim = copy.into_primitive().tensor();
        access = Access::CopiedShared;
    }
    if !prim.is_contiguous() {
        prim = burn_cubecl::kernel::into_contiguous(prim);
        if access == Access::InPlace {
            access = Access::CopiedStrided;
        }
    }
    let offset_bytes = prim.handle.offset_start.unwrap_or(0);
    let resource = prim
        .client
        .get_resource(prim.handle.clone())
        .map_err(|e| DeviceError::Gpu(format!("reading a tensor's device address: {e:?}")))?;
    let ptr = resource.resource().ptr;
    let tensor = Tensor::from_primitive(TensorPrimitive::Float(into_fusion(prim)));
    Ok(DeviceMemory { tensor, ptr, len, offset_bytes, access })
}

/// A cubecl tensor handed to burn's fusion as a tensor of [`Cuda`] (as
/// `Fusion::float_from_data` registers a new one): the same device memory.
fn into_fusion(
    prim: CubeTensor<CudaRuntime>,
) -> FusionTensor<burn_cubecl::fusion::FusionCubeRuntime<CudaRuntime>> {
    use burn::tensor::TensorMetadata;
    use burn_ir::{InitOperationIr, OperationIr, OperationOutput};
    let client = burn_fusion::get_client::<CudaCube>(&prim.device);
    let (shape, dtype) = (prim.shape(), prim.dtype());
    let handle = <CudaCube as burn_ir::BackendIr>::float_tensor_handle(prim);
    let desc = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
    client
        .register(
            burn_fusion::stream::OperationStreams::default(),
            OperationIr::Init(desc),
            NoOp::<CudaCube>::new(),
        )
        .output()
}

/// Bytes of memory in use on GPU `ordinal` (every process's), from the
/// driver (`cuMemGetInfo`).
///
/// The driver answers for the context current on the calling thread, and
/// burn makes its context current only on its own runner thread: this makes
/// the GPU's primary context (the one burn uses) current here first.
pub fn memory_used_bytes(ordinal: usize) -> Result<u64, DeviceError> {
    use cudarc::driver::result as cu;
    let driver = |what: &str, e: cudarc::driver::DriverError| DeviceError::Gpu(format!("{what}: {e:?}"));
    cu::init().map_err(|e| driver("cuInit", e))?;
    let dev = cu::device::get(ordinal as std::ffi::c_int).map_err(|e| driver("cuDeviceGet", e))?;
    let previous = cu::ctx::get_current().map_err(|e| driver("cuCtxGetCurrent", e))?;
    // SAFETY: `dev` is a valid device; the retain is released below on every path.
    let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
    // SAFETY: `ctx` is live (retained above).
    let used = unsafe { cu::ctx::set_current(ctx) }
        .map_err(|e| driver("cuCtxSetCurrent", e))
        .and_then(|()| cu::mem_get_info().map_err(|e| driver("cuMemGetInfo", e)))
        .map(|(free, total)| (total - free) as u64);
    // SAFETY: the thread's context as it was (a live one or none), then the
    // retain above released (burn holds its own while it uses the GPU).
    unsafe {
        let _ = cu::ctx::set_current(previous.unwrap_or(std::ptr::null_mut()));
        let _ = cu::primary_ctx::release(dev);
    }
    used
}

#[cfg(feature = "nccl")]
mod buckets;
mod buffer;
#[cfg(feature = "nccl")]
mod in_place;

#[cfg(feature = "nccl")]
pub use buckets::{NcclBuckets, gradient_reducer};
pub use buffer::{DeviceBuffer, copy_seconds, device_name};
/// A CUDA stream, as the driver API names it (for [`copy_seconds`]).
pub use cudarc::driver::sys::CUstream;
#[cfg(feature = "nccl")]
pub use in_place::{CaseCheck, CaseKind, InPlaceCase, InPlaceReport, check_in_place};

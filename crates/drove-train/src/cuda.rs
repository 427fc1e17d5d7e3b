//! The CUDA backend (feature `cuda`): burn-cuda without fusion
//! (`CubeBackend<CudaRuntime>`, whose tensors' device memory can be reached),
//! a check that the libraries it loads at run time are there, and (feature
//! `nccl`) [`NcclBuckets`], the in-place device all-reduce of gradient buckets.
//!
//! A missing `libcuda`, `libnvrtc` or CUDA header folder would otherwise panic
//! inside cudarc or on burn's device thread; [`open_gpu`] names the missing
//! piece and what to install or set instead.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;

use crate::TrainError;

/// burn's CUDA backend without fusion: f32 floats, i32 ints, u8 bools.
pub type Cuda = CubeBackend<CudaRuntime, f32, i32, u8>;
/// A GPU as burn names it.
pub use cubecl::cuda::CudaDevice;

fn missing(library: &str, hint: &str) -> TrainError {
    TrainError::Gpu(format!("{library} cannot be loaded: {hint}"))
}

/// Checks that training can run on GPU `ordinal` (libcuda and a driver that
/// shows the GPU, libnvrtc, the CUDA headers NVRTC compiles against) and
/// returns burn's device for it. Nothing is touched before the checks pass,
/// so a machine without a GPU gets this error and no panic.
pub fn open_gpu(ordinal: usize) -> Result<CudaDevice, TrainError> {
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
            return Err(TrainError::Gpu(format!(
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
    let driver = |what: &str, e: cudarc::driver::DriverError| TrainError::Gpu(format!("{what}: {e:?}"));
    cudarc::driver::result::init().map_err(|e| driver("initialising the CUDA driver (cuInit)", e))?;
    let count = cudarc::driver::result::device::get_count().map_err(|e| driver("counting GPUs", e))? as usize;
    if ordinal >= count {
        return Err(TrainError::Gpu(format!(
            "GPU {ordinal} was asked for but this process sees {count} GPU(s) (CUDA_VISIBLE_DEVICES={}); \
             under `drove run` each rank takes the GPU of its local rank: start at most {count} rank(s) per \
             host, or name one with --device cuda:N",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        )));
    }
    Ok(CudaDevice::new(ordinal))
}

/// Waits for every kernel burn queued on `device` (a host sync).
pub fn sync(device: &CudaDevice) -> Result<(), TrainError> {
    <Cuda as Backend>::sync(device).map_err(|e| TrainError::Gpu(format!("waiting for the GPU: {e:?}")))
}

/// A 1-D tensor's device memory, after a copy if burn shares its buffer or
/// lays it out with strides; the returned tensor owns the memory.
///
/// The address is read with `get_resource`; burn 0.21 has no way to order a
/// foreign stream after its own, so the caller syncs (see [`sync`]) before
/// other work touches it.
pub fn device_memory(tensor: Tensor<Cuda, 1>) -> Result<(Tensor<Cuda, 1>, u64, usize), TrainError> {
    let len = tensor.dims()[0];
    let mut prim = tensor.into_primitive().tensor();
    if !prim.can_mut() {
        // Shared with another tensor: writing in place would change it too.
        let copy = Tensor::<Cuda, 1>::from_primitive(TensorPrimitive::Float(prim)).mul_scalar(1.0);
        prim = copy.into_primitive().tensor();
    }
    if !prim.is_contiguous() {
        prim = burn_cubecl::kernel::into_contiguous(prim);
    }
    let resource = prim
        .client
        .get_resource(prim.handle.clone())
        .map_err(|e| TrainError::Gpu(format!("reading a tensor's device address: {e:?}")))?;
    let ptr = resource.resource().ptr;
    let tensor = Tensor::from_primitive(TensorPrimitive::Float(prim));
    Ok((tensor, ptr, len))
}

#[cfg(feature = "nccl")]
pub use nccl::NcclBuckets;

#[cfg(feature = "nccl")]
mod nccl {
    use drove_comm::{Collective, DType, ReduceOptions};
    use drove_nccl::{DeviceComm, DeviceOptions, DeviceSlice, Nccl};

    use super::{Cuda, CudaDevice, device_memory, sync};
    use crate::TrainError;
    use crate::device::BucketAllReduce;
    use burn::tensor::Tensor;

    /// The gradient all-reduce of the backend placement on GPUs: each bucket is
    /// reduced in place in device memory by NCCL, without a host copy.
    ///
    /// Per bucket there is one host sync (burn's stream is private, so its
    /// kernels are waited for before NCCL reads the bucket, and NCCL's stream
    /// is waited for before burn reads it back) and the description check over
    /// the CPU mesh (one small message exchange).
    pub struct NcclBuckets {
        comm: DeviceComm<Nccl>,
        device: CudaDevice,
    }

    impl NcclBuckets {
        /// Joins an NCCL communicator of every rank of `mesh` on GPU `ordinal`
        /// (burn's `device` for it).
        pub fn connect(
            mesh: &dyn Collective,
            ordinal: usize,
            device: CudaDevice,
            opts: DeviceOptions,
        ) -> Result<Self, TrainError> {
            let nccl = Nccl::new(ordinal).map_err(|e| TrainError::Gpu(e.to_string()))?;
            let comm = DeviceComm::connect(mesh, nccl, opts).map_err(nccl_error)?;
            Ok(NcclBuckets { comm, device })
        }

        /// What NCCL runs on.
        pub fn describe(&self) -> String {
            self.comm.describe()
        }
    }

    fn nccl_error(e: drove_nccl::Error) -> TrainError {
        match e {
            drove_nccl::Error::Comm(c) => TrainError::Comm(c),
            other => TrainError::Gpu(other.to_string()),
        }
    }

    impl BucketAllReduce<Cuda> for NcclBuckets {
        fn all_reduce(
            &self,
            comm: &dyn Collective,
            name: &str,
            bucket: Tensor<Cuda, 1>,
            op: ReduceOptions,
        ) -> Result<Tensor<Cuda, 1>, TrainError> {
            let (bucket, ptr, len) = device_memory(bucket)?;
            sync(&self.device)?;
            let slice = DeviceSlice { ptr, len, dtype: DType::F32 };
            // SAFETY: `bucket` owns the memory (copied if shared) and lives past
            // the call; burn's work on it is finished (synced above) and none
            // is queued until the call returns, which is after NCCL's stream
            // has finished with it.
            unsafe { self.comm.all_reduce(comm, name, slice, op) }.map_err(nccl_error)?;
            Ok(bucket)
        }
    }
}

//! [`NcclBuckets`]: the gradient all-reduce of the backend placement on GPUs,
//! each bucket reduced by NCCL where it lies in device memory.

use burn::tensor::Tensor;
use drove_collective::fusion::Plan;
use drove_collective::{Collective, DType, ReduceOptions};
use drove_nccl::{DeviceComm, DeviceOptions, DeviceSlice, Nccl};

use super::{Cuda, CudaDevice, DeviceMemory, device_memory, sync};
use crate::DeviceError;
use crate::{BucketAllReduce, bucket_name, pack_bucket, unpack_bucket};

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

/// The gradient all-reduce of a replica on GPU `ordinal` (burn's `device`
/// for it), for `Replica::with_bucket_all_reduce`: NCCL buckets when `mesh`
/// has more than one rank, `None` alone (there is nothing to reduce).
pub fn gradient_reducer(
    mesh: &dyn Collective,
    ordinal: usize,
    device: CudaDevice,
    opts: DeviceOptions,
) -> Result<Option<NcclBuckets>, DeviceError> {
    if mesh.world_size() < 2 {
        return Ok(None);
    }
    NcclBuckets::connect(mesh, ordinal, device, opts).map(Some)
}

impl NcclBuckets {
    /// Joins an NCCL communicator of every rank of `mesh` on GPU `ordinal`
    /// (burn's `device` for it).
    pub fn connect(
        mesh: &dyn Collective,
        ordinal: usize,
        device: CudaDevice,
        opts: DeviceOptions,
    ) -> Result<Self, DeviceError> {
        let nccl = Nccl::new(ordinal)?;
        let comm = DeviceComm::connect(mesh, nccl, opts).map_err(nccl_error)?;
        Ok(NcclBuckets { comm, device })
    }

    /// What NCCL runs on.
    pub fn describe(&self) -> String {
        self.comm.describe()
    }

    /// Burn's device the communicator's GPU is.
    pub fn device(&self) -> &CudaDevice {
        &self.device
    }

    /// Gathers every rank's `send` into `recv` in rank order, device memory to
    /// device memory (`recv` holds `world` times `send`'s length). Returns
    /// both tensors: each the one given, or the copy [`device_memory`] made
    /// of it (a `recv` that shares its buffer is copied first, so that the
    /// tensors it shares with are not written).
    pub fn all_gather_into(
        &self,
        comm: &dyn Collective,
        name: &str,
        send: Tensor<Cuda, 1>,
        recv: Tensor<Cuda, 1>,
    ) -> Result<(Tensor<Cuda, 1>, Tensor<Cuda, 1>), DeviceError> {
        let (send, recv) = (device_memory(send)?, device_memory(recv)?);
        sync(&self.device)?;
        // SAFETY: both tensors own their memory (copied if shared) and live past
        // the call; burn's work on them is finished (synced above) and none is
        // queued until the call returns, after NCCL's stream has finished.
        unsafe { self.comm.all_gather(comm, name, slice(&send), slice(&recv)) }.map_err(nccl_error)?;
        Ok((send.tensor, recv.tensor))
    }
}

fn slice(memory: &DeviceMemory) -> DeviceSlice {
    DeviceSlice { ptr: memory.ptr, len: memory.len, dtype: DType::F32 }
}

fn nccl_error(e: drove_nccl::Error) -> DeviceError {
    match e {
        drove_nccl::Error::Comm(c) => DeviceError::Comm(c),
        other => DeviceError::Nccl(other),
    }
}

impl NcclBuckets {
    /// Reduces one bucket (a 1-D tensor) in place in device memory with `op`;
    /// returns the reduced bucket (the one given, or the copy
    /// [`device_memory`] made of it when it shared its buffer).
    pub fn all_reduce_bucket(
        &self,
        comm: &dyn Collective,
        name: &str,
        bucket: Tensor<Cuda, 1>,
        op: ReduceOptions,
    ) -> Result<Tensor<Cuda, 1>, DeviceError> {
        let bucket = device_memory(bucket)?;
        sync(&self.device)?;
        // SAFETY: `bucket` owns the memory (copied if shared) and lives past
        // the call; burn's work on it is finished (synced above) and none
        // is queued until the call returns, which is after NCCL's stream
        // has finished with it.
        unsafe { self.comm.all_reduce(comm, name, slice(&bucket), op) }.map_err(nccl_error)?;
        Ok(bucket.tensor)
    }
}

/// Every bucket of the plan in turn, dense: a row-sparse table of the plan is
/// reduced whole, as the one gradient of its bucket (sending only the rows
/// touched is a saving of the host path, where the wire is the cost).
impl BucketAllReduce<Cuda> for NcclBuckets {
    fn all_reduce(
        &self,
        comm: &dyn Collective,
        name: &str,
        grads: &mut [Tensor<Cuda, 1>],
        plan: &Plan,
        op: ReduceOptions,
    ) -> Result<(), DeviceError> {
        for (b, bucket) in plan.buckets.iter().enumerate() {
            let name = bucket_name(name, b);
            let reduced = self.all_reduce_bucket(comm, &name, pack_bucket(grads, bucket), op)?;
            unpack_bucket(&name, reduced, bucket, grads)?;
        }
        Ok(())
    }
}

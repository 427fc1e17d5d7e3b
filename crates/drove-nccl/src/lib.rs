//! # drove-nccl: device collectives that check their arguments and never hang
//!
//! The GPU data plane of a drove job: all-reduce (sum, average, min, max,
//! product), broadcast, all-gather, reduce-scatter and barrier on raw device
//! memory, run by NCCL (feature `nccl`) on a stream of its own. NCCL itself
//! hangs when ranks call different ops and waits forever for a dead peer; a
//! [`DeviceComm`] adds what drove-comm's CPU backend has:
//!
//! - **Agreement before data**: each op's description (name, dtype, shape, op,
//!   root) is checked across ranks over the CPU mesh first
//!   ([`drove_collective::Collective::agree`]); a mismatch fails every rank with the
//!   same named error and the device is never touched.
//! - **Deadlines**: the NCCL communicator is non-blocking and polled; past the
//!   deadline it is aborted (`ncclCommAbort`) and the error is the CPU
//!   backend's timeout, naming the ranks that did not come.
//! - **Joining through the mesh**: rank 0 creates the NCCL unique id and
//!   broadcasts it over the CPU mesh.
//!
//! - **Elastic worlds**: [`ElasticDevice`] gives each generation of an
//!   elastic run its own communicator (abort the old, a new unique id, join
//!   again), since NCCL cannot change a communicator's members.
//!
//! That logic is generic over a [`Device`]: `Nccl` (feature `nccl`) on a GPU, or
//! [`Loopback`], an in-process stand-in on host memory, which is how it is
//! tested on machines without one.
//!
//! ```no_run
//! use drove_collective::{Collective, DType, Place, ReduceOptions};
//! use drove_comm::{CommOptions, Communicator, FileRendezvous};
//! use drove_nccl::{DeviceComm, DeviceOptions, DeviceSlice, LoopbackWorld};
//!
//! // Under a launcher: `drove_launch::connect_from_env()?`.
//! let rendezvous = FileRendezvous::new("/tmp/drove-rendezvous", Place::new(0, 1)?);
//! let mesh = Communicator::connect(&rendezvous, CommOptions::default())?;
//! # let device = LoopbackWorld::new(1).1.pop().unwrap();
//! // let device = drove_nccl::Nccl::new(local_rank)?;   // with feature `nccl`
//! let comm = DeviceComm::connect(&mesh, device, DeviceOptions::default())?;
//! let mut grad = vec![1.0f32; 1024]; // device memory, for a real device
//! let slice = DeviceSlice { ptr: grad.as_mut_ptr() as u64, len: grad.len(), dtype: DType::F32 };
//! // SAFETY: `grad` outlives the call and nothing else writes it.
//! unsafe { comm.all_reduce(&mesh, "grad", slice, ReduceOptions::average())? };
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod comm;
mod device;
mod elastic;
mod loopback;
#[cfg(feature = "nccl")]
mod nccl;

pub use comm::{DeviceComm, DeviceOptions, DeviceSlice, Error};
pub use device::{Device, DeviceCall, GpuLibraryError, UniqueId};
pub use elastic::{ElasticDevice, MakeDevice};
pub use loopback::{Loopback, LoopbackWorld};
#[cfg(feature = "nccl")]
pub use nccl::{Nccl, require_libraries};

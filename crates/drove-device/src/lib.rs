//! # drove-device: the device plane, in one place
//!
//! Everything drove knows about GPUs: which device a rank trains on
//! ([`DeviceChoice`], `--device`) and which GPU of its host that is
//! ([`gpu_ordinal`], Horovod's "pin each GPU"); opening it with every failure
//! named instead of a panic ([`Gpu`]: CUDA through burn-cubecl with fusion,
//! feature `cuda`; any Vulkan, Metal or DX12 GPU through wgpu, feature
//! `wgpu`); where compiled kernels are kept between runs and how many a run
//! launches ([`kernels`]); and how gradients leave the device, through one
//! seam, [`BucketAllReduce`]: [`HostStaging`] (a bucket copied to the host
//! and averaged by a [`drove_collective::Collective`]) everywhere, or NCCL on
//! the bucket's device memory (`cuda::NcclBuckets`, feature `nccl`, on
//! drove-nccl's deadline-checked communicator), chosen by [`GradientPath`].
//!
//! Why a crate of its own: a trainer (drove-train's `Replica`) needs only the
//! seam; the NER fine-tune, the benchmarks and the command line need the
//! devices; and none of them should carry CUDA or wgpu code of its own. A
//! build without GPU features has the choice, the seam and host staging, and
//! says how to build a drove that has the rest.
//!
//! ```
//! use drove_device::{DeviceChoice, Gpu};
//!
//! let choice: DeviceChoice = "cpu".parse()?;
//! assert!(!choice.is_gpu());
//! // The CPU opens nothing; `cuda:0` or `wgpu` open a GPU (or say why not).
//! assert!(Gpu::open(choice, 0)?.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod choice;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
pub mod kernels;
mod open;
mod reduce;
mod sharing;
mod staging;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use choice::{DeviceChoice, GradientPath};
pub use error::DeviceError;
pub use open::{BUILD_HINT, Gpu, Opened, list_devices};
#[cfg(feature = "cuda")]
pub use open::{CudaGradients, cuda_gradient_path};
pub use reduce::{BucketAllReduce, bucket_name, pack_bucket, unpack_bucket};
pub use sharing::{adapter_for_local_rank, gpu_identity, gpu_ordinal, ranks_sharing_gpus, sharing_groups};
pub use staging::{HostStaging, read_back};

//! # drove-train: data-parallel training of any burn model, through the `Collective` trait
//!
//! [`Replica`] owns one rank's copy of a model and its distributed step, as
//! Horovod's `DistributedOptimizer` does for PyTorch: built from a burn module,
//! a [`drove_collective::Collective`] and [`ReplicaOptions`], it broadcasts rank 0's
//! parameters; each [`Replica::step`] takes this rank's batch and a loss
//! closure, runs micro-batches at once, accumulates `backward_passes_per_step`
//! passes, averages the gradients across ranks (fused into buckets, the
//! embedding tables as the rows the batch touched: [`SparseRows`]), clips
//! them, and applies AdamW with a warmup/decay schedule and the learning rate
//! scaled by the world size. [`Replica::save`] and [`Replica::load`] checkpoint
//! and resume every rank from one folder. Where parameters and optimizer state
//! live is a [`Placement`]: host flat buffers (the CPU fast path) or tensors on
//! the backend's device, whose gradient all-reduce goes through one seam,
//! drove-device's [`BucketAllReduce`](drove_device::BucketAllReduce) (host
//! staging, or NCCL in place): this crate opens no device and holds no GPU
//! code; drove-device does.
//!
//! The parts it is made of are public too: [`broadcast_parameters`] and
//! [`all_reduce_gradients`] for a loop of one's own, [`flat`] (flat buffers,
//! clipping, AdamW, and [`flat::decays`], the one rule of which parameters
//! take weight decay), [`device`] (the same on the device), [`micro`],
//! [`schedule`] (LR scaling and the one [`Schedule`] type) and
//! [`checkpoint`]. `drove-ner` is one user: the BERT fine-tune
//! for named-entity recognition that joins `drove-bert` and `drove-collate`;
//! this crate depends on neither.
//!
//! Parameters are visited in module order, which is the same on every rank for
//! the same model type, so ranks exchange matching buffers without naming them.
#![deny(missing_docs)]

pub mod checkpoint;
pub mod device;
mod error;
mod exchange;
pub mod flat;
mod gradients;
pub mod micro;
pub mod overlap;
mod phase;
mod placement;
pub mod replica;
pub mod schedule;
mod sparse;
pub mod timeline;

pub use error::{NoLocalGradient, TrainError};
pub use exchange::{all_reduce_gradients, broadcast_parameters};
pub use placement::Placement;
pub use replica::{
    LossRead, LossReduction, Micro, PhaseTimes, Replica, ReplicaOptions, Resynced, Rows, StepOutcome,
};
pub use schedule::Schedule;
pub use sparse::{SPARSE_ROWS, SparseRows};

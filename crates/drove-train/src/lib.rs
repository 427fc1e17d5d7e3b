//! # drove-train: data-parallel training of any burn model, through the `Collective` trait
//!
//! [`Replica`] owns one rank's copy of a model and its distributed step, as
//! Horovod's `DistributedOptimizer` does for PyTorch: built from a burn module,
//! a [`drove_collective::Collective`] and [`ReplicaOptions`], it broadcasts rank 0's
//! parameters; each [`Replica::step`] takes this rank's batch and a loss
//! closure, runs micro-batches at once, accumulates `backward_passes_per_step`
//! passes, averages the gradients across ranks (fused into buckets), clips
//! them, and applies AdamW with a warmup/decay schedule and the learning rate
//! scaled by the world size. [`Replica::save`] and [`Replica::load`] checkpoint
//! and resume every rank from one folder. Where parameters and optimizer state
//! live is a [`Placement`]: host flat buffers (the CPU fast path) or tensors on
//! the backend's device, whose gradient all-reduce goes through one seam,
//! [`device::BucketAllReduce`].
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
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod flat;
pub mod gpu;
pub mod micro;
mod placement;
pub mod replica;
pub mod schedule;
pub mod timeline;

pub use placement::Placement;
pub use replica::{LossReduction, Micro, PhaseTimes, Replica, ReplicaOptions, Resynced, Rows, StepOutcome};
pub use schedule::Schedule;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use drove_collective::fusion::{FusionOptions, all_reduce_fused};
use drove_collective::{Collective, CommError, Element, ReduceOptions};

/// A distributed step that failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// Options that cannot work.
    #[error("invalid option: {0}")]
    Options(String),
    /// The ranks do not hold the same state.
    #[error("ranks disagree: {0}")]
    Disagree(String),
    /// A checkpoint could not be written or read.
    #[error(transparent)]
    Checkpoint(#[from] checkpoint::CheckpointError),
    /// The GPU, or a library it needs, is missing or failed.
    #[error("{0}")]
    Gpu(String),
    /// A step's loss or global gradient norm was not finite: no update was
    /// applied, and every rank stops with this error.
    #[error(
        "step {step}: the {what} is {value}, not finite ({}); no update was applied",
        if ranks.is_empty() { "every rank's local loss is finite".to_string() }
        else { format!("local loss not finite on rank(s) {ranks:?}") }
    )]
    NonFinite {
        /// The step that failed (1-based: the update it would have been).
        step: u64,
        /// What was not finite: `loss` or `global gradient norm`.
        what: &'static str,
        /// Its value.
        value: f64,
        /// The ranks whose own loss was not finite.
        ranks: Vec<usize>,
    },
    /// A tensor could not be read as f32.
    #[error("parameter {index} could not be read as f32: {message}")]
    Data {
        /// Position of the parameter in module order.
        index: usize,
        /// What went wrong.
        message: String,
    },
}

fn to_f32(data: TensorData, index: usize) -> Result<Vec<f32>, TrainError> {
    // `into_vec` hands over the tensor's own allocation when it can.
    data.convert::<f32>().into_vec::<f32>().map_err(|e| TrainError::Data { index, message: format!("{e:?}") })
}

/// Averages the gradients of `model`'s parameters across the ranks of `comm`,
/// in place in `grads`, fused into buckets per `fusion`.
pub fn all_reduce_gradients<B, M, C>(
    model: &M,
    grads: &mut GradientsParams,
    comm: &C,
    fusion: FusionOptions,
    device: &B::Device,
) -> Result<(), TrainError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    C: Collective + ?Sized,
{
    let mut flat = flat::take_gradients(model, grads)?;
    let mut refs: Vec<&mut [f32]> = flat.iter_mut().map(|v| v.as_mut_slice()).collect();
    all_reduce_fused(comm, "gradients", &mut refs, ReduceOptions::average(), fusion)?;
    let mut scatter = Scatter::<B> { grads, flat: flat.into_iter(), device: device.clone() };
    model.visit(&mut scatter);
    Ok(())
}

/// Puts the averaged gradients back, in module order.
struct Scatter<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    flat: std::vec::IntoIter<Vec<f32>>,
    device: B::Device,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scatter<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let values = self.flat.next().expect("one buffer per parameter");
        let shape = param.val().dims();
        let tensor = Tensor::<B::InnerBackend, D>::from_data(TensorData::new(values, shape), &self.device);
        self.grads.register::<B::InnerBackend, D>(param.id, tensor);
    }
}

/// Makes every rank's parameters equal to `root`'s (call once, before training).
pub fn broadcast_parameters<B, M, C>(
    model: M,
    comm: &C,
    root: usize,
    device: &B::Device,
) -> Result<M, TrainError>
where
    B: Backend,
    M: Module<B>,
    C: Collective + ?Sized,
{
    let mut params = flat::FlatParams::read(&model)?;
    broadcast_flat(&mut params, comm, root)?;
    // Written back as fresh tensors that keep each parameter trainable.
    Ok(params.write(model, device))
}

/// Makes every rank's flat parameters equal to `root`'s, one broadcast each.
pub(crate) fn broadcast_flat<C: Collective + ?Sized>(
    params: &mut flat::FlatParams,
    comm: &C,
    root: usize,
) -> Result<(), TrainError> {
    for (index, (values, shape)) in params.values.iter_mut().zip(&params.shapes).enumerate() {
        comm.broadcast(&format!("parameter.{index}"), shape, f32::tensor_mut(values), root)?;
    }
    Ok(())
}

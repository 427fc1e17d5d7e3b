//! # drove-train: the distributed step, through the `Collective` trait
//!
//! The pieces of a data-parallel step on burn that touch other ranks, and
//! nothing else: a trainer calls [`broadcast_parameters`] once so every rank
//! starts from rank 0's weights, and [`all_reduce_gradients`] after each
//! backward pass so every rank applies the same averaged gradients (fused into
//! buckets, optionally compressed on the wire). It talks to the transport only
//! through [`drove_comm::Collective`].
//!
//! Around them: [`flat`] (parameters and gradients as flat buffers, clipping,
//! AdamW), [`micro`] (a rank's batch split into micro-batches that run at once,
//! one per core), [`schedule`], [`checkpoint`], and [`ner`], the fine-tuning
//! loop that joins `drove-bert` and `drove-collate`.
//!
//! Parameters are visited in module order, which is the same on every rank for
//! the same model type, so ranks exchange matching buffers without naming them.
#![deny(missing_docs)]

pub mod checkpoint;
pub mod flat;
pub mod micro;
pub mod ner;
pub mod schedule;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use drove_comm::fusion::{FusionOptions, all_reduce_fused};
use drove_comm::{Collective, CommError, Element, ReduceOptions};

/// A distributed step that failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
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
    for (index, (values, shape)) in params.values.iter_mut().zip(&params.shapes).enumerate() {
        comm.broadcast(&format!("parameter.{index}"), shape, f32::tensor_mut(values), root)?;
    }
    // Written back as fresh tensors that keep each parameter trainable.
    Ok(params.write(model, device))
}

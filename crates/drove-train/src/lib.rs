//! # drove-train: the distributed step, through the `Collective` trait
//!
//! The pieces of a data-parallel step on burn that touch other ranks, and
//! nothing else: a trainer calls [`broadcast_parameters`] once so every rank
//! starts from rank 0's weights, and [`all_reduce_gradients`] after each
//! backward pass so every rank applies the same averaged gradients (fused into
//! buckets, optionally compressed on the wire). It talks to the transport only
//! through [`drove_comm::Collective`]; it knows nothing of BERT or of data.
//!
//! Parameters are visited in module order, which is the same on every rank for
//! the same model type, so ranks exchange matching buffers without naming them.
#![deny(missing_docs)]

pub mod checkpoint;
pub mod flat;
pub mod ner;
pub mod schedule;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
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
    data.convert::<f32>().to_vec::<f32>().map_err(|e| TrainError::Data { index, message: format!("{e:?}") })
}

/// Collects every float gradient (or zeros, for a parameter without one) in
/// module order, removing them from `grads`.
struct Gather<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    flat: Vec<Vec<f32>>,
    shapes: Vec<Vec<usize>>,
    error: Option<TrainError>,
    _b: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Gather<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.flat.len();
        let shape = param.val().dims().to_vec();
        let values = match self.grads.remove::<B::InnerBackend, D>(param.id) {
            Some(g) => match to_f32(g.into_data(), index) {
                Ok(v) => v,
                Err(e) => {
                    self.error.get_or_insert(e);
                    vec![0.0; shape.iter().product()]
                }
            },
            None => vec![0.0; shape.iter().product()],
        };
        self.flat.push(values);
        self.shapes.push(shape);
    }
}

/// Puts the averaged gradients back, in the same order.
struct Scatter<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    flat: std::vec::IntoIter<Vec<f32>>,
    shapes: std::vec::IntoIter<Vec<usize>>,
    device: B::Device,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scatter<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let (values, shape) =
            (self.flat.next().expect("one buffer per parameter"), self.shapes.next().expect("shape"));
        let tensor = Tensor::<B::InnerBackend, D>::from_data(TensorData::new(values, shape), &self.device);
        self.grads.register::<B::InnerBackend, D>(param.id, tensor);
    }
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
    let mut gather = Gather::<B> {
        grads,
        flat: Vec::new(),
        shapes: Vec::new(),
        error: None,
        _b: std::marker::PhantomData,
    };
    model.visit(&mut gather);
    if let Some(e) = gather.error {
        return Err(e);
    }
    let (mut flat, shapes) = (gather.flat, gather.shapes);
    let mut refs: Vec<&mut [f32]> = flat.iter_mut().map(|v| v.as_mut_slice()).collect();
    all_reduce_fused(comm, "gradients", &mut refs, ReduceOptions::average(), fusion)?;
    let mut scatter = Scatter::<B> {
        grads: gather.grads,
        flat: flat.into_iter(),
        shapes: shapes.into_iter(),
        device: device.clone(),
    };
    model.visit(&mut scatter);
    Ok(())
}

/// Replaces every float parameter with `root`'s, in module order.
struct Broadcast<'a, C: Collective + ?Sized, B: Backend> {
    comm: &'a C,
    root: usize,
    index: usize,
    error: Option<TrainError>,
    device: B::Device,
}

impl<C: Collective + ?Sized, B: Backend> ModuleMapper<B> for Broadcast<'_, C, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let index = self.index;
        self.index += 1;
        if self.error.is_some() {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.dims().to_vec();
        let mut values = match to_f32(tensor.clone().into_data(), index) {
            Ok(v) => v,
            Err(e) => {
                self.error = Some(e);
                return Param::from_mapped_value(id, tensor, mapper);
            }
        };
        let name = format!("parameter.{index}");
        if let Err(e) = self.comm.broadcast(&name, &shape, f32::tensor_mut(&mut values), self.root) {
            self.error = Some(e.into());
            return Param::from_mapped_value(id, tensor, mapper);
        }
        // A fresh tensor does not track gradients: keep the parameter trainable.
        let value = Tensor::<B, D>::from_data(TensorData::new(values, shape), &self.device)
            .set_require_grad(tensor.is_require_grad());
        Param::from_mapped_value(id, value, mapper)
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
    let mut mapper = Broadcast::<C, B> { comm, root, index: 0, error: None, device: device.clone() };
    let model = model.map(&mut mapper);
    match mapper.error {
        Some(e) => Err(e),
        None => Ok(model),
    }
}

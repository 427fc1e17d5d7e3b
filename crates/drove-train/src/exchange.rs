//! The two exchanges of a data-parallel loop of one's own (a [`Replica`](crate::Replica)
//! makes them itself): [`broadcast_parameters`], once before training, and
//! [`all_reduce_gradients`], after each backward pass.

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use drove_collective::fusion::{FusionOptions, Plan};
use drove_collective::{Collective, Element};

use crate::TrainError;
use crate::flat;
use crate::gradients::{GradientAllReduce, StepGradients};

/// Averages the gradients of `model`'s parameters across the ranks of `comm`,
/// in place in `grads`, fused into buckets per `fusion`: through the door a
/// [`Replica`](crate::Replica)'s step takes, on host buffers.
pub fn all_reduce_gradients<B, M>(
    model: &M,
    grads: &mut GradientsParams,
    comm: &dyn Collective,
    fusion: FusionOptions,
    device: &B::Device,
) -> Result<(), TrainError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
{
    let mut flat = flat::take_gradients(model, grads)?;
    let bytes: Vec<usize> = flat.iter().map(|g| g.len() * 4).collect();
    let plan = Plan::dense(&bytes, fusion.threshold_bytes);
    let door = GradientAllReduce::<B::InnerBackend>::new(comm, plan, fusion.compression);
    door.average(StepGradients::Host(&mut flat))?;
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
        let tensor: Tensor<B::InnerBackend, D> =
            drove_kernels::transfer::upload(TensorData::new(values, shape), &self.device);
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

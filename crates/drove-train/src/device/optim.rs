//! Clipping and AdamW on the device over one flat buffer for every
//! parameter, as PyTorch's `AdamW(fused=True)` and apex's multi-tensor apply
//! do: the gradients are gathered into one 1-D tensor, their global norm is
//! one reduction, the clip scale is computed and applied on the device (no
//! host decision between the norm and the update), and the moments and the
//! parameters are updated by a dozen element-wise operations over the whole
//! buffer, whatever the number of parameters. Before, each of those ran per
//! parameter: about fifteen kernels for each of MiniLM's 104 parameters.
//!
//! The maths is [`FlatAdamW`]'s, element for element (the same f32
//! operations in the same order), so the host and backend placements take
//! the same step; only the norm's summation order differs (one reduction on
//! the device against blocks on the host).

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::TrainError;
use crate::flat::{AdamWSettings, AdamWStep, FlatAdamW};

/// `parts` end to end in one 1-D tensor (`parts[0]` itself when alone):
/// `Tensor::cat`'s values, packed on drove's GPU backends by
/// [`drove_kernels::pack::concat`] in a launch for each group of parts
/// instead of one a part.
///
/// # Panics
/// If `parts` is empty.
pub fn flatten<B: Backend>(parts: &[Tensor<B, 1>]) -> Tensor<B, 1> {
    drove_kernels::pack::concat(parts.to_vec())
}

/// The L2 norm of `flat`, as a one-element tensor on the device.
pub fn global_norm<B: Backend>(flat: &Tensor<B, 1>) -> Tensor<B, 1> {
    flat.clone().powi_scalar(2).sum().sqrt()
}

/// `flat` scaled by `max_norm / (norm + 1e-6)` when that is below 1 (never
/// with `max_norm` 0), and the norm before clipping, both on the device: the
/// scale is clamped to 1 there instead of being decided on the host. As
/// [`crate::flat::clip_global_norm`].
pub fn clip_global_norm<B: Backend>(flat: Tensor<B, 1>, max_norm: f64) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let norm = global_norm(&flat);
    if max_norm <= 0.0 {
        return (flat, norm);
    }
    let scale = norm.clone().add_scalar(1e-6).recip().mul_scalar(max_norm).clamp_max(1.0);
    (flat * scale, norm)
}

/// AdamW whose moments are two flat tensors on the device (every parameter
/// end to end, in module order): [`FlatAdamW`]'s update in a handful of
/// kernels.
pub struct DeviceAdamW<B: Backend> {
    /// Settings.
    pub settings: AdamWSettings,
    /// Updates applied so far.
    pub step: u64,
    /// First moments, flat, in module order.
    pub m: Tensor<B, 1>,
    /// Second moments.
    pub v: Tensor<B, 1>,
    /// Whether each parameter decays.
    pub decay: Vec<bool>,
    /// Elements of each parameter, in module order.
    sizes: Vec<usize>,
    /// 1 where an element's parameter decays, else 0: `decays * (keep - 1)
    /// + 1` is each element's factor exactly (`keep` or 1; `keep - 1` is
    /// exact in f32, `keep` lying within a factor 2 of 1).
    decays: Tensor<B, 1>,
    /// The flat buffer the model's parameters are views of since the last
    /// update, so that the next one needs no gather (104 copies for MiniLM
    /// and a copy of every parameter). Dropped by [`DeviceAdamW::load_flat`]:
    /// the parameters change only through this optimizer or a restore.
    params: Option<Tensor<B, 1>>,
}

impl<B: Backend> DeviceAdamW<B> {
    /// Fresh state for parameters of `shapes`, `decay` saying which decay.
    pub fn new(settings: AdamWSettings, shapes: &[Vec<usize>], decay: Vec<bool>, device: &B::Device) -> Self {
        let sizes: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
        let total = sizes.iter().sum::<usize>();
        let mask: Vec<f32> = sizes
            .iter()
            .zip(&decay)
            .flat_map(|(&n, &d)| std::iter::repeat_n(if d { 1.0 } else { 0.0 }, n))
            .collect();
        DeviceAdamW {
            settings,
            step: 0,
            m: Tensor::zeros([total], device),
            v: Tensor::zeros([total], device),
            decay,
            sizes,
            decays: drove_kernels::transfer::upload(TensorData::new(mask, [total]), device),
            params: None,
        }
    }

    /// One update of `model`'s float parameters with `grads` (every
    /// gradient end to end, module order) at learning rate `lr`; returns the
    /// updated model, every parameter keeping its id and whether it requires
    /// a gradient (each a view of one new flat buffer).
    ///
    /// With a `guard` (values on the device, such as the step's loss and
    /// gradient norm), the update is decided there without a read: when any
    /// of its values is not finite the parameters and moments keep their
    /// values bit for bit. The step count moves on either way; the caller,
    /// once it has read the guard, takes a refused step back with
    /// [`DeviceAdamW::refused`].
    ///
    /// # Panics
    /// If the model's parameters do not match the state in number.
    pub fn update<AB, M>(&mut self, model: M, grads: Tensor<B, 1>, lr: f64, guard: Option<Tensor<B, 1>>) -> M
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: AutodiffModule<AB>,
    {
        if self.sizes.is_empty() {
            return model;
        }
        let p = match self.params.take() {
            Some(kept) => kept,
            None => {
                let mut gather = Gather::<AB> { out: Vec::new() };
                model.visit(&mut gather);
                assert_eq!(gather.out.len(), self.sizes.len(), "one gradient per parameter");
                flatten(&gather.out)
            }
        };
        self.step += 1;
        let k = AdamWStep::new(&self.settings, self.step, lr);
        let keep = k.keep(true);
        let AdamWStep { b1, b2, eps, step_size, c2_sqrt, .. } = k;
        let g = grads;
        // The order of FlatAdamW::update, operation for operation.
        let m = self.m.clone().mul_scalar(b1) + g.clone().mul_scalar(1.0 - b1);
        let v = self.v.clone().mul_scalar(b2) + g.clone().mul_scalar(1.0 - b2).mul(g);
        let denominator = v.clone().sqrt().div_scalar(c2_sqrt).add_scalar(eps);
        let factor = self.decays.clone().mul_scalar(keep - 1.0).add_scalar(1.0);
        let updated = p.clone().mul(factor) - m.clone().mul_scalar(step_size).div(denominator);
        let (p, m, v) = match guard {
            None => (updated, m, v),
            Some(guard) => {
                // One flag for the whole buffer, broadcast: every element keeps
                // its old value when the guard is not all finite.
                let refused = guard.is_finite().all().bool_not().expand([p.shape().num_elements()]);
                (
                    updated.mask_where(refused.clone(), p),
                    m.mask_where(refused.clone(), self.m.clone()),
                    v.mask_where(refused, self.v.clone()),
                )
            }
        };
        self.m = m;
        self.v = v;
        self.params = Some(p.clone());
        let mut scatter = Scatter::<AB> { flat: p, offset: 0, _b: std::marker::PhantomData };
        model.map(&mut scatter)
    }

    /// Takes back the step count of an update its guard refused (the
    /// parameters and moments kept their values on the device).
    pub fn refused(&mut self) {
        self.step = self.step.saturating_sub(1);
    }

    /// The moments as host buffers, one per parameter (for a checkpoint).
    pub fn to_flat(&self) -> Result<FlatAdamW, TrainError> {
        let read = |t: &Tensor<B, 1>| -> Result<Vec<Vec<f32>>, TrainError> {
            let all = crate::flat::to_f32(drove_kernels::transfer::read(t.clone()), 0)?;
            let mut rest = all.as_slice();
            Ok(self
                .sizes
                .iter()
                .map(|&n| {
                    let (head, tail) = rest.split_at(n);
                    rest = tail;
                    head.to_vec()
                })
                .collect())
        };
        Ok(FlatAdamW {
            settings: self.settings,
            step: self.step,
            m: read(&self.m)?,
            v: read(&self.v)?,
            decay: self.decay.clone(),
        })
    }

    /// Takes the moments and step of `flat` (from a checkpoint).
    pub fn load_flat(&mut self, flat: &FlatAdamW, device: &B::Device) {
        let write = |bufs: &[Vec<f32>]| -> Tensor<B, 1> {
            let all: Vec<f32> = bufs.concat();
            let n = all.len();
            drove_kernels::transfer::upload(TensorData::new(all, [n]), device)
        };
        self.m = write(&flat.m);
        self.v = write(&flat.v);
        self.step = flat.step;
        self.params = None;
    }
}

/// Reads a one-element tensor (the norm) back to the host.
pub fn scalar<B: Backend>(t: Tensor<B, 1>) -> f64 {
    drove_kernels::transfer::read_scalar(t)
}

/// Every float parameter's value, flat, in module order.
struct Gather<AB: AutodiffBackend> {
    out: Vec<Tensor<AB::InnerBackend, 1>>,
}

impl<AB: AutodiffBackend> ModuleVisitor<AB> for Gather<AB> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<AB, D>>) {
        let value = param.val().inner();
        let numel = value.shape().num_elements();
        self.out.push(value.reshape([numel]));
    }
}

/// Gives each parameter, in module order, its piece of the updated buffer.
struct Scatter<AB: AutodiffBackend> {
    flat: Tensor<AB::InnerBackend, 1>,
    offset: usize,
    _b: std::marker::PhantomData<AB>,
}

impl<AB: AutodiffBackend> ModuleMapper<AB> for Scatter<AB> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let trainable = tensor.is_require_grad();
        let shape = tensor.shape();
        let n = shape.num_elements();
        let piece = self.flat.clone().slice(self.offset..self.offset + n).reshape(shape);
        self.offset += n;
        let value = Tensor::<AB, D>::from_inner(piece);
        Param::from_mapped_value(id, if trainable { value.require_grad() } else { value }, mapper)
    }
}

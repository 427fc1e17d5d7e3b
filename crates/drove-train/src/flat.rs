//! Parameters and gradients as flat `f32` buffers in module order, and the
//! optimiser that works on them.
//!
//! The distributed step averages gradients as flat buffers anyway, so the update
//! runs there too: [`FlatAdamW`] is AdamW (decoupled weight decay, bias
//! correction, as `torch.optim.AdamW`) fused into one pass per parameter, with
//! the global-norm clipping of [`clip_global_norm`] before it. Its state (two
//! moments per element and a step count) is plain data, so a checkpoint is a
//! safetensors file.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;

use crate::TrainError;

/// Elements per piece when element-wise work is spread over rayon's threads:
/// large enough that a piece costs far more than handing it out.
pub(crate) const PIECE: usize = 1 << 16;

/// The values of `data` as f32 (parameter `index` in module order, for the error).
pub(crate) fn to_f32(data: TensorData, index: usize) -> Result<Vec<f32>, TrainError> {
    // `into_vec` hands over the tensor's own allocation when it can.
    data.convert::<f32>().into_vec::<f32>().map_err(|e| TrainError::Data { index, message: format!("{e:?}") })
}

/// A model's float parameters, flattened, with their dotted names and shapes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlatParams {
    /// Dotted module paths, e.g. `bert.layers.5.query.weight`.
    pub names: Vec<String>,
    /// Shapes, as the model holds them.
    pub shapes: Vec<Vec<usize>>,
    /// Values, row-major.
    pub values: Vec<Vec<f32>>,
}

impl FlatParams {
    /// Reads every float parameter of `model`, in module order.
    pub fn read<B: Backend, M: Module<B>>(model: &M) -> Result<Self, TrainError> {
        let mut reader = Reader { path: Vec::new(), out: FlatParams::default(), error: None };
        model.visit(&mut reader);
        match reader.error {
            Some(e) => Err(e),
            None => Ok(reader.out),
        }
    }

    /// Writes these values into `model`'s parameters (same order and shapes),
    /// keeping each parameter's id and whether it requires a gradient.
    pub fn write<B: Backend, M: Module<B>>(&self, model: M, device: &B::Device) -> M {
        // The copies (90 MB for MiniLM) are made on rayon's threads; the
        // tensors are built from them in module order.
        let copies: Vec<Vec<f32>> = self.values.par_iter().map(|v| v.clone()).collect();
        let mut writer = Writer { values: copies.into_iter(), device: device.clone() };
        model.map(&mut writer)
    }

    /// Total number of elements.
    pub fn numel(&self) -> usize {
        self.values.iter().map(Vec::len).sum()
    }

    /// Position of the parameter called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }
}

/// The dotted names of `model`'s float parameters, in module order (the
/// names [`FlatParams::read`] gives, without reading a value).
pub fn parameter_names<B: Backend, M: Module<B>>(model: &M) -> Vec<String> {
    struct Names {
        path: Vec<String>,
        out: Vec<String>,
    }
    impl<B: Backend> ModuleVisitor<B> for Names {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, _param: &Param<Tensor<B, D>>) {
            self.out.push(self.path.join("."));
        }
    }
    let mut names = Names { path: Vec::new(), out: Vec::new() };
    model.visit(&mut names);
    names.out
}

struct Reader {
    path: Vec<String>,
    out: FlatParams,
    error: Option<TrainError>,
}

impl<B: Backend> ModuleVisitor<B> for Reader {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let index = self.out.values.len();
        let tensor = param.val();
        let shape = tensor.dims().to_vec();
        let values = match to_f32(drove_kernels::transfer::read(tensor), index) {
            Ok(v) => v,
            Err(e) => {
                self.error.get_or_insert(e);
                vec![0.0; shape.iter().product()]
            }
        };
        self.out.names.push(self.path.join("."));
        self.out.shapes.push(shape);
        self.out.values.push(values);
    }
}

struct Writer<B: Backend> {
    values: std::vec::IntoIter<Vec<f32>>,
    device: B::Device,
}

impl<B: Backend> ModuleMapper<B> for Writer<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let values = self.values.next().expect("one buffer per float parameter");
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.dims();
        let value = drove_kernels::transfer::upload::<B, D, _>(TensorData::new(values, shape), &self.device)
            .set_require_grad(tensor.is_require_grad());
        Param::from_mapped_value(id, value, mapper)
    }
}

/// Takes every float gradient out of `grads` as a flat buffer, in module order
/// (zeros for a parameter that got none).
pub fn take_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &mut GradientsParams,
) -> Result<Vec<Vec<f32>>, TrainError> {
    struct Take<'a, B> {
        grads: &'a mut GradientsParams,
        out: Vec<Vec<f32>>,
        error: Option<TrainError>,
        _b: std::marker::PhantomData<B>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Take<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let index = self.out.len();
            let numel: usize = param.val().dims().iter().product();
            let values = match self.grads.remove::<B::InnerBackend, D>(param.id) {
                Some(g) => to_f32(drove_kernels::transfer::read(g), index).unwrap_or_else(|e| {
                    self.error.get_or_insert(e);
                    vec![0.0; numel]
                }),
                None => vec![0.0; numel],
            };
            self.out.push(values);
        }
    }
    let mut take = Take::<B> { grads, out: Vec::new(), error: None, _b: std::marker::PhantomData };
    model.visit(&mut take);
    match take.error {
        Some(e) => Err(e),
        None => Ok(take.out),
    }
}

/// The L2 norm of all gradients together.
pub fn global_norm(grads: &[Vec<f32>]) -> f64 {
    // Blocks of 4096 summed in 16 f32 lanes (vectorised), the blocks in f64,
    // on rayon's threads; the block sums are added in order, so the result
    // does not depend on the number of threads.
    let block_sum = |block: &[f32]| {
        let mut lanes = [0f32; 16];
        let mut chunks = block.chunks_exact(16);
        for c in &mut chunks {
            for (l, &x) in lanes.iter_mut().zip(c) {
                *l += x * x;
            }
        }
        let tail: f32 = chunks.remainder().iter().map(|&x| x * x).sum();
        lanes.iter().map(|&l| f64::from(l)).sum::<f64>() + f64::from(tail)
    };
    let sums: Vec<f64> = grads
        .iter()
        .flat_map(|g| g.chunks(4096))
        .collect::<Vec<_>>()
        .par_iter()
        .map(|b| block_sum(b))
        .collect();
    sums.iter().sum::<f64>().sqrt()
}

/// Scales every gradient by `max_norm / norm` when their global norm exceeds
/// `max_norm` (as `torch.nn.utils.clip_grad_norm_`); returns the norm before
/// clipping.
pub fn clip_global_norm(grads: &mut [Vec<f32>], max_norm: f64) -> f64 {
    let norm = global_norm(grads);
    let scale = max_norm / (norm + 1e-6);
    if scale < 1.0 {
        let scale = scale as f32;
        grads.par_iter_mut().flat_map(|g| g.par_chunks_mut(PIECE)).for_each(|piece| {
            for x in piece {
                *x *= scale;
            }
        });
    }
    norm
}

/// AdamW settings (`torch.optim.AdamW` / transformers' defaults but the decay).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWSettings {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the denominator.
    pub epsilon: f64,
    /// Decoupled weight decay (not applied to biases and LayerNorm weights).
    pub weight_decay: f64,
}

impl Default for AdamWSettings {
    fn default() -> Self {
        AdamWSettings { beta1: 0.9, beta2: 0.999, epsilon: 1e-8, weight_decay: 0.01 }
    }
}

/// The scalars of one AdamW update, as `f32`: what [`FlatAdamW`] and
/// [`DeviceAdamW`](crate::device::DeviceAdamW) both apply, so the two
/// placements compute the same numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// First-moment decay.
    pub b1: f32,
    /// Second-moment decay.
    pub b2: f32,
    /// Added to the denominator.
    pub eps: f32,
    /// The rate over the first moment's bias correction.
    pub step_size: f32,
    /// The square root of the second moment's bias correction.
    pub c2_sqrt: f32,
    /// What a decaying parameter is multiplied by first.
    pub decayed: f32,
}

impl AdamWStep {
    /// The scalars of update number `step` (1-based) at rate `lr`.
    pub fn new(s: &AdamWSettings, step: u64, lr: f64) -> Self {
        let t = step as i32;
        let c1 = 1.0 - s.beta1.powi(t);
        let c2 = 1.0 - s.beta2.powi(t);
        AdamWStep {
            b1: s.beta1 as f32,
            b2: s.beta2 as f32,
            eps: s.epsilon as f32,
            step_size: (lr / c1) as f32,
            c2_sqrt: c2.sqrt() as f32,
            decayed: (1.0 - lr * s.weight_decay) as f32,
        }
    }

    /// What a parameter is multiplied by before the step.
    pub fn keep(&self, decays: bool) -> f32 {
        if decays { self.decayed } else { 1.0 }
    }
}

/// The default patterns of the parameters that take no weight decay: as
/// transformers' `Trainer`, not the biases and not the LayerNorm weights.
pub const NO_DECAY: [&str; 2] = ["*bias", "*norm.*"];

/// Whether the parameter called `name` (a dotted module path) takes weight
/// decay: it does unless it matches one of the `no_decay` patterns, where `*`
/// stands for any run of characters (see [`NO_DECAY`]). The one weight-decay
/// rule of both placements and of checkpoints.
pub fn decays<S: AsRef<str>>(name: &str, no_decay: &[S]) -> bool {
    !no_decay.iter().any(|pattern| glob(pattern.as_ref(), name))
}

/// `*` matches any run of characters; everything else matches itself.
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// AdamW over flat buffers; its state is two moments per element and a step.
#[derive(Clone, Debug, PartialEq)]
pub struct FlatAdamW {
    /// Settings.
    pub settings: AdamWSettings,
    /// Updates applied so far.
    pub step: u64,
    /// First moments, one buffer per parameter.
    pub m: Vec<Vec<f32>>,
    /// Second moments.
    pub v: Vec<Vec<f32>>,
    /// Whether each parameter decays.
    pub decay: Vec<bool>,
}

impl FlatAdamW {
    /// Fresh state for `params`, decaying those [`decays`] picks with the
    /// default [`NO_DECAY`] patterns.
    pub fn new(settings: AdamWSettings, params: &FlatParams) -> Self {
        FlatAdamW {
            settings,
            step: 0,
            m: params.values.iter().map(|p| vec![0.0; p.len()]).collect(),
            v: params.values.iter().map(|p| vec![0.0; p.len()]).collect(),
            decay: params.names.iter().map(|n| decays(n, &NO_DECAY)).collect(),
        }
    }

    /// One update of `params` with `grads` at learning rate `lr`.
    ///
    /// # Panics
    /// If `grads` does not match `params` buffer for buffer.
    pub fn update(&mut self, params: &mut FlatParams, grads: &[Vec<f32>], lr: f64) {
        assert_eq!(grads.len(), params.values.len(), "one gradient per parameter");
        self.step += 1;
        let k = AdamWStep::new(&self.settings, self.step, lr);
        let AdamWStep { b1, b2, eps, step_size, c2_sqrt, .. } = k;
        for (i, (p, g)) in params.values.iter().zip(grads).enumerate() {
            assert_eq!(p.len(), g.len(), "gradient {i} has the wrong length");
        }
        // Element-wise, so pieces on rayon's threads give the serial result.
        let decay = &self.decay;
        params
            .values
            .par_iter_mut()
            .zip(grads)
            .zip(self.m.par_iter_mut().zip(self.v.par_iter_mut()))
            .enumerate()
            .flat_map(|(i, ((p, g), (m, v)))| {
                let keep = k.keep(decay[i]);
                p.par_chunks_mut(PIECE)
                    .zip(g.par_chunks(PIECE))
                    .zip(m.par_chunks_mut(PIECE).zip(v.par_chunks_mut(PIECE)))
                    .map(move |piece| (keep, piece))
            })
            .for_each(|(keep, ((p, g), (m, v)))| {
                for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    *p = *p * keep - step_size * *m / ((*v).sqrt() / c2_sqrt + eps);
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_scales_to_the_bound_and_leaves_small_gradients_alone() {
        let mut g = vec![vec![3.0f32], vec![4.0]];
        let norm = clip_global_norm(&mut g, 1.0);
        assert!((norm - 5.0).abs() < 1e-9);
        assert!((global_norm(&g) - 1.0).abs() < 1e-5, "{g:?}");
        let mut small = vec![vec![0.3f32, 0.4]];
        clip_global_norm(&mut small, 1.0);
        assert_eq!(small, vec![vec![0.3f32, 0.4]]);
    }

    #[test]
    fn adamw_matches_the_closed_form_first_step() {
        // First step: m = (1-b1) g, v = (1-b2) g^2, so the update is lr * sign(g)
        // (up to eps), after decay p *= 1 - lr * wd.
        let mut params = FlatParams {
            names: vec!["w.weight".into(), "w.bias".into()],
            shapes: vec![vec![2], vec![1]],
            values: vec![vec![1.0, -2.0], vec![0.5]],
        };
        let mut opt = FlatAdamW::new(AdamWSettings::default(), &params);
        opt.update(&mut params, &[vec![0.1, -0.2], vec![3.0]], 0.01);
        let keep = 1.0 - 0.01 * 0.01;
        assert!((params.values[0][0] - (1.0 * keep - 0.01) as f32).abs() < 1e-6);
        assert!((params.values[0][1] - (-2.0 * keep + 0.01) as f32).abs() < 1e-6);
        assert!((params.values[1][0] - (0.5 - 0.01)).abs() < 1e-6, "bias does not decay");
    }

    #[test]
    fn decay_excludes_biases_and_layer_norms() {
        assert!(decays("bert.layers.0.query.weight", &NO_DECAY));
        assert!(!decays("bert.layers.0.query.bias", &NO_DECAY));
        assert!(!decays("bert.layers.0.attention_norm.gamma", &NO_DECAY));
        assert!(!decays("bert.embeddings.norm.beta", &NO_DECAY));
        for name in ["a.bias", "x.norm.gamma", "classifier.bias"] {
            assert!(!decays(name, &NO_DECAY), "{name}");
        }
    }

    #[test]
    fn no_decay_patterns_are_globs() {
        assert!(glob("out.*", "out.weight") && !glob("out.*", "hidden.weight"));
        assert!(glob("exact", "exact") && !glob("exact", "exactly"));
        assert!(glob("a*b*c", "a-b-c") && !glob("a*b*c", "a-c-b"));
        let no_decay = vec!["out.*".to_string()];
        assert!(!decays("out.weight", &no_decay) && decays("hidden.bias", &no_decay));
    }
}

//! What the overlap puts into burn's autodiff graph: the hook on each
//! parameter that hands its finished gradient to the engine, the ladder of
//! ticks that sets the hook's depth, and the probes that measure, once, at
//! which depth each parameter's gradient is finished.
//!
//! burn-autodiff 0.21 runs backward level by level, deepest first, where a
//! node's level is one more than its deepest parent's. A hook `H(w, t)` is an
//! identity on the parameter `w` whose second parent `t` (an untracked tick,
//! no compute) gives it a chosen level: every layer that uses the parameter
//! has a deeper level than the hook, so when the hook's backward runs, the
//! parameter's gradient is whole. Chosen one level above the layer's input,
//! the hook changes no other node's level (so no sum in backward changes
//! order, and the gradients are those of the graph without hooks, bit for
//! bit) and fires right after the layer's backward. The level is measured by
//! probes: a chain of no-op nodes, one per level, added to the loss with
//! nothing else changed; each probe looks, when its level runs, which
//! parameters already have a gradient.

use std::any::Any;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::engine::Arrival;

/// burn's autodiff tensor over `I` (the primitive of `Autodiff<I>`).
type Node<I> = FloatTensor<Autodiff<I>>;

/// Whether `B` is burn's `Autodiff` without checkpointing over its inner
/// backend: the graph the hooks are written for.
pub(crate) fn supported<B: AutodiffBackend>() -> bool {
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<Autodiff<B::InnerBackend>>()
}

/// The autodiff tensor of `t`, if `B` is [`supported`].
fn node<B: AutodiffBackend, const D: usize>(t: Tensor<B, D>) -> Option<Node<B::InnerBackend>> {
    let t: Box<dyn Any> = Box::new(t);
    let t = t.downcast::<Tensor<Autodiff<B::InnerBackend>, D>>().ok()?;
    Some(t.into_primitive().tensor())
}

/// `node` back as a tensor of `B` (which is `Autodiff<B::InnerBackend>`).
fn from_node<B: AutodiffBackend, const D: usize>(node: Node<B::InnerBackend>) -> Tensor<B, D> {
    let t: Box<dyn Any> =
        Box::new(Tensor::<Autodiff<B::InnerBackend>, D>::from_primitive(TensorPrimitive::Float(node)));
    *t.downcast::<Tensor<B, D>>().expect("B is Autodiff<B::InnerBackend> (checked by `supported`)")
}

/// The level of `t` in the autodiff graph (0 for a leaf).
pub(crate) fn level<B: AutodiffBackend, const D: usize>(t: &Tensor<B, D>) -> Option<usize> {
    node::<B, D>(t.clone()).map(|n| n.node.order)
}

/// Untracked nodes of every level up to the highest asked, each made from the
/// one below without compute: what gives a hook its level.
pub(crate) struct Ticks<I: Backend> {
    ladder: Vec<Node<I>>,
}

#[derive(Debug)]
struct Tick;

impl<I: Backend> Backward<I, 1> for Tick {
    type State = ();
    fn backward(self, _: Ops<(), 1>, _: &mut Gradients, _: &mut Checkpointer) {}
}

impl<I: Backend> Ticks<I> {
    /// Ticks up to `top` (the deepest hook's level minus one) on `device`.
    pub(crate) fn new(top: usize, device: &I::Device) -> Self {
        let root: Node<I> = Tensor::<Autodiff<I>, 1>::zeros([1], device).into_primitive().tensor();
        let mut ladder = vec![root];
        while ladder.len() <= top {
            let below = ladder.last().expect("the root").clone();
            let next = match <Tick as Backward<I, 1>>::prepare::<NoCheckpointing>(Tick, [below.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish((), below.primitive.clone()),
                OpsKind::UnTracked(prep) => prep.finish(below.primitive.clone()),
            };
            ladder.push(next);
        }
        Ticks { ladder }
    }

    /// The tick of `level`.
    fn at(&self, level: usize) -> &Node<I> {
        &self.ladder[level]
    }
}

/// Where a hook sends the gradient it sees.
#[derive(Clone, Debug)]
pub(crate) struct HookTarget {
    /// The parameter, in module order.
    pub param: usize,
    /// The micro-batch whose graph this is.
    pub micro: usize,
    /// The engine's inbox.
    pub tx: Sender<Arrival>,
}

#[derive(Debug)]
struct Hook<const D: usize>;

impl<I: Backend, const D: usize> Backward<I, 2> for Hook<D> {
    type State = HookTarget;
    fn backward(self, ops: Ops<HookTarget, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        // The parameter's whole gradient: every layer that uses it is deeper.
        // It goes to the engine as host values (read here, on the thread
        // whose device queue made it); the leaf gets none.
        let grad = grads.consume::<I>(&ops.node);
        let data =
            drove_kernels::transfer::read(Tensor::<I, D>::from_primitive(TensorPrimitive::Float(grad)));
        let target = ops.state;
        let values = crate::flat::to_f32(data, target.param);
        // A closed inbox means the engine stopped on an error it reports.
        let _ = target.tx.send(Arrival::Gradient {
            param: target.param,
            micro: target.micro,
            values,
            sent: Instant::now(),
        });
    }
}

/// `model` with fresh leaves (as [`fresh_leaves`](crate::micro::fresh_leaves))
/// whose parameter `k` goes through a hook at level `levels[k]` when that is
/// `Some`; the hooks send to `tx` as micro-batch `micro`.
pub(crate) fn hooked<B: AutodiffBackend, M: Module<B>>(
    model: M,
    levels: &[Option<usize>],
    ticks: &Ticks<B::InnerBackend>,
    tx: &Sender<Arrival>,
    micro: usize,
) -> M {
    struct Hooking<'a, I: Backend> {
        levels: &'a [Option<usize>],
        ticks: &'a Ticks<I>,
        tx: &'a Sender<Arrival>,
        micro: usize,
        index: usize,
    }
    impl<B: AutodiffBackend> ModuleMapper<B> for Hooking<'_, B::InnerBackend> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let index = self.index;
            self.index += 1;
            let (id, tensor, mapper) = param.consume();
            let trainable = tensor.is_require_grad();
            let leaf = tensor.detach();
            let leaf = if trainable { leaf.require_grad() } else { leaf };
            let hooked = match (trainable, self.levels.get(index).copied().flatten()) {
                (true, Some(level)) => {
                    let w = node::<B, D>(leaf).expect("a supported backend");
                    let target = HookTarget { param: index, micro: self.micro, tx: self.tx.clone() };
                    let tick = self.ticks.at(level - 1);
                    let node = match <Hook<D> as Backward<B::InnerBackend, 2>>::prepare::<NoCheckpointing>(
                        Hook::<D>,
                        [w.node.clone(), tick.node.clone()],
                    )
                    .compute_bound()
                    .stateful()
                    {
                        OpsKind::Tracked(prep) => prep.finish(target, w.primitive.clone()),
                        OpsKind::UnTracked(prep) => prep.finish(w.primitive.clone()),
                    };
                    from_node::<B, D>(node)
                }
                _ => leaf,
            };
            Param::from_mapped_value(id, hooked, mapper)
        }
    }
    model.map(&mut Hooking { levels, ticks, tx, micro, index: 0 })
}

/// What the probes of one micro-batch saw: for each parameter, the deepest
/// level at which its gradient was there.
#[derive(Debug)]
struct ProbeLog<I: Backend> {
    leaves: Vec<Option<Node<I>>>,
    seen: Vec<Option<usize>>,
}

#[derive(Debug)]
struct Probe;

impl<I: Backend> Backward<I, 1> for Probe {
    type State = Arc<Mutex<ProbeLog<I>>>;
    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let level = ops.node.order;
        {
            let mut log = ops.state.lock().unwrap_or_else(|e| e.into_inner());
            let log = &mut *log;
            for (leaf, seen) in log.leaves.iter().zip(log.seen.iter_mut()) {
                if let (Some(leaf), None) = (leaf, &seen)
                    && grads.get::<I>(leaf).is_some()
                {
                    *seen = Some(level);
                }
            }
        }
        unary::<I, _>(ops.parents, ops.node, grads, |grad| grad);
    }
}

/// The probes of one micro-batch's graph: [`Probes::root`] adds them to the
/// loss, and after backward [`Probes::levels`] says where each parameter's
/// gradient was finished.
pub(crate) struct Probes<I: Backend> {
    log: Arc<Mutex<ProbeLog<I>>>,
}

impl<I: Backend> Probes<I> {
    /// Probes for the parameters of `model` (the micro-batch's copy).
    pub(crate) fn new<B: AutodiffBackend<InnerBackend = I>, M: Module<B>>(model: &M) -> Self {
        struct Leaves<I: Backend>(Vec<Option<Node<I>>>);
        impl<B: AutodiffBackend> ModuleVisitor<B> for Leaves<B::InnerBackend> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let t = param.val();
                self.0.push(if t.is_require_grad() { node::<B, D>(t) } else { None });
            }
        }
        let mut leaves = Leaves::<I>(Vec::new());
        model.visit(&mut leaves);
        let seen = vec![None; leaves.0.len()];
        Probes { log: Arc::new(Mutex::new(ProbeLog { leaves: leaves.0, seen })) }
    }

    /// `loss` plus a chain of probes, one at every level below the loss's:
    /// the same gradients (the probes add zero and touch nothing else).
    pub(crate) fn root<B: AutodiffBackend<InnerBackend = I>>(&self, loss: Tensor<B, 1>) -> Tensor<B, 1> {
        let Some(top) = level(&loss) else { return loss };
        let device = loss.device();
        let base =
            node::<B, 1>(Tensor::<B, 1>::zeros([1], &device).require_grad()).expect("a supported backend");
        let mut below = base;
        for _ in 0..top {
            below = match <Probe as Backward<I, 1>>::prepare::<NoCheckpointing>(Probe, [below.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(self.log.clone(), below.primitive.clone()),
                OpsKind::UnTracked(prep) => prep.finish(below.primitive.clone()),
            };
        }
        loss + from_node::<B, 1>(below)
    }

    /// For each parameter, the deepest level at which its gradient was seen
    /// (`None`: only after the last probe).
    pub(crate) fn seen(self) -> Vec<Option<usize>> {
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.leaves.clear(); // the leaves' graph is done with
        std::mem::take(&mut log.seen)
    }
}

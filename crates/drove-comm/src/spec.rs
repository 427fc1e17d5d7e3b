//! A collective described without its data, for backends whose data moves
//! elsewhere (NCCL on a GPU) but whose arguments are checked over the CPU mesh
//! first, so that a mismatch fails every rank with one named error instead of
//! hanging the device.

use crate::comm::ReduceOptions;
use crate::desc::{OpDesc, OpKind};
use crate::dtype::DType;

/// Which collective an [`OpSpec`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// All-reduce.
    AllReduce,
    /// Broadcast from [`OpSpec::root`].
    Broadcast,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Barrier.
    Barrier,
}

/// What one rank is about to do, checked across ranks by
/// [`Collective::agree`](crate::Collective::agree) before the data moves.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSpec {
    /// The collective.
    pub kind: SpecKind,
    /// The op's name (every rank must use the same).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape; for all-gather the first dimension may differ between ranks.
    pub shape: Vec<usize>,
    /// How values combine (all-reduce and reduce-scatter).
    pub reduce: Option<ReduceOptions>,
    /// The root (broadcast).
    pub root: usize,
    /// Why this rank's arguments are invalid, found before the check; every
    /// rank then fails with it, naming this rank.
    pub problem: Option<String>,
}

impl OpSpec {
    /// An op of `kind` named `name` on a tensor of `dtype` and `shape`.
    pub fn new(kind: SpecKind, name: &str, dtype: DType, shape: &[usize]) -> Self {
        OpSpec {
            kind,
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            reduce: None,
            root: 0,
            problem: None,
        }
    }

    /// The same op reducing with `opts`.
    pub fn reducing(mut self, opts: ReduceOptions) -> Self {
        self.reduce = Some(opts);
        self
    }

    /// The same op from `root`.
    pub fn from_root(mut self, root: usize) -> Self {
        self.root = root;
        self
    }

    /// The label errors use, e.g. `all_reduce "grad"`.
    pub fn label(&self) -> String {
        self.desc().label()
    }

    pub(crate) fn desc(&self) -> OpDesc {
        let kind = match self.kind {
            SpecKind::AllReduce => OpKind::AllReduce,
            SpecKind::Broadcast => OpKind::Broadcast,
            SpecKind::AllGather => OpKind::AllGather,
            SpecKind::ReduceScatter => OpKind::ReduceScatter,
            SpecKind::Barrier => OpKind::Barrier,
        };
        OpDesc {
            seq: 0,
            kind,
            name: self.name.clone(),
            dtype: self.dtype,
            shape: self.shape.iter().map(|&d| d as u64).collect(),
            reduce: self.reduce.map(|r| r.op),
            prescale: self.reduce.map_or(1.0, |r| r.prescale),
            postscale: self.reduce.map_or(1.0, |r| r.postscale),
            root: self.root as u32,
            problem: self.problem.clone().unwrap_or_default(),
        }
    }
}

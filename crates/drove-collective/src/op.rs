//! [`OpDesc`]: one collective described without its data. Every rank sends
//! its description to every other before data moves, and the ranks check
//! them all alike ([`agree`](crate::transport::agree)); a backend whose data moves
//! elsewhere (NCCL on a GPU) checks them over the CPU first with
//! [`Collective::agree`](crate::Collective::agree), so a mismatch fails
//! every rank with one named error instead of hanging the device.

use std::fmt::{self, Display};

use crate::dtype::{DType, ReduceOp};

/// How an all-reduce or reduce-scatter combines values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReduceOptions {
    /// The combining op.
    pub op: ReduceOp,
    /// Factor applied to each rank's input before reducing (floats only).
    pub prescale: f64,
    /// Factor applied to the result (floats only).
    pub postscale: f64,
}

impl ReduceOptions {
    /// `op` without scaling.
    pub fn new(op: ReduceOp) -> Self {
        ReduceOptions { op, prescale: 1.0, postscale: 1.0 }
    }
    /// Sum.
    pub fn sum() -> Self {
        Self::new(ReduceOp::Sum)
    }
    /// Average.
    pub fn average() -> Self {
        Self::new(ReduceOp::Average)
    }
    /// With a pre-scale factor.
    pub fn prescale(mut self, factor: f64) -> Self {
        self.prescale = factor;
        self
    }
    /// With a post-scale factor.
    pub fn postscale(mut self, factor: f64) -> Self {
        self.postscale = factor;
        self
    }
}

impl Default for ReduceOptions {
    fn default() -> Self {
        Self::sum()
    }
}

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// All-reduce.
    AllReduce,
    /// Broadcast from [`OpDesc::root`].
    Broadcast,
    /// All-gather (first dimensions may differ).
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Barrier.
    Barrier,
    /// A communicator's leave: every rank closes its connections together,
    /// so none closes one a peer still needs.
    Shutdown,
}

impl OpKind {
    pub(crate) fn code(self) -> u8 {
        self as u8
    }
    pub(crate) fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => OpKind::AllReduce,
            1 => OpKind::Broadcast,
            2 => OpKind::AllGather,
            3 => OpKind::ReduceScatter,
            4 => OpKind::Barrier,
            5 => OpKind::Shutdown,
            _ => return None,
        })
    }
}

impl Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::Barrier => "barrier",
            OpKind::Shutdown => "shutdown",
        })
    }
}

/// What one rank is about to do: the one description of a collective, sent
/// to every other rank before data moves and checked by [`agree`](crate::transport::agree).
#[derive(Clone, Debug, PartialEq)]
pub struct OpDesc {
    /// The collective.
    pub kind: OpKind,
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
    /// The op's place in this rank's call order (set by the transport; a
    /// rank that skipped an op is named by it).
    pub seq: u64,
}

impl OpDesc {
    /// An op of `kind` named `name` on a tensor of `dtype` and `shape`.
    pub fn new(kind: OpKind, name: &str, dtype: DType, shape: &[usize]) -> Self {
        OpDesc {
            kind,
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
            reduce: None,
            root: 0,
            problem: None,
            seq: 0,
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

    /// The same op, invalid on this rank for `problem` (if any).
    pub fn with_problem(mut self, problem: Option<String>) -> Self {
        self.problem = problem;
        self
    }

    /// The label errors use, e.g. `all_reduce "grad"`.
    pub fn label(&self) -> String {
        format!("{} {:?}", self.kind, self.name)
    }

    fn reduce_op(&self) -> Option<ReduceOp> {
        self.reduce.map(|r| r.op)
    }

    /// The frame every rank sends: a little-endian `u32` length, then the body.
    pub fn encode(&self) -> Vec<u8> {
        let problem = self.problem.as_deref().unwrap_or("");
        let (prescale, postscale) = self.reduce.map_or((1.0, 1.0), |r| (r.prescale, r.postscale));
        let mut b = Vec::with_capacity(64 + self.name.len() + 8 * self.shape.len());
        b.extend_from_slice(&[0u8; 4]); // frame length, filled below
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.push(self.kind.code());
        b.push(self.dtype.code());
        b.push(self.reduce_op().map_or(255, ReduceOp::code));
        b.extend_from_slice(&u32::try_from(self.root).unwrap_or(u32::MAX).to_le_bytes());
        b.extend_from_slice(&f64::to_bits(prescale).to_le_bytes());
        b.extend_from_slice(&f64::to_bits(postscale).to_le_bytes());
        b.extend_from_slice(&(self.shape.len() as u32).to_le_bytes());
        for &d in &self.shape {
            b.extend_from_slice(&(d as u64).to_le_bytes());
        }
        b.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b.extend_from_slice(&(problem.len() as u32).to_le_bytes());
        b.extend_from_slice(problem.as_bytes());
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_le_bytes());
        b
    }

    /// Decodes a frame body (without its length prefix); `None` if it is not one.
    pub fn decode(body: &[u8]) -> Option<OpDesc> {
        let mut r = Reader(body);
        let seq = r.u64()?;
        let kind = OpKind::from_code(r.u8()?)?;
        let dtype = DType::from_code(r.u8()?)?;
        let op = match r.u8()? {
            255 => None,
            c => Some(ReduceOp::from_code(c)?),
        };
        let root = usize::try_from(r.u32()?).ok()?;
        let prescale = f64::from_bits(r.u64()?);
        let postscale = f64::from_bits(r.u64()?);
        let ndim = r.u32()? as usize;
        if ndim > 64 {
            return None;
        }
        let shape = (0..ndim).map(|_| usize::try_from(r.u64()?).ok()).collect::<Option<Vec<_>>>()?;
        let name_len = r.u32()? as usize;
        let name = String::from_utf8(r.take(name_len)?.to_vec()).ok()?;
        let problem_len = r.u32()? as usize;
        let problem = String::from_utf8(r.take(problem_len)?.to_vec()).ok()?;
        let reduce = op.map(|op| ReduceOptions { op, prescale, postscale });
        let problem = (!problem.is_empty()).then_some(problem);
        Some(OpDesc { kind, name, dtype, shape, reduce, root, problem, seq })
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

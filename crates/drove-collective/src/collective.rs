//! [`Collective`], the seam between a trainer and its transport, and the
//! small types its ops take and give.

use std::sync::mpsc::{Receiver, Sender, channel};

use crate::dtype::{Buffer, TensorMut, TensorRef};
use crate::error::CommError;
use crate::op::{OpDesc, ReduceOptions};

/// The result of an all-gather: every rank's tensor, concatenated on the first
/// dimension in rank order.
#[derive(Clone, Debug, PartialEq)]
pub struct Gathered {
    /// The elements.
    pub data: Buffer,
    /// Each rank's first dimension.
    pub first_dims: Vec<usize>,
    /// The shape of `data`.
    pub shape: Vec<usize>,
}

/// An op in flight; `wait` for its result.
#[must_use = "an async op must be waited on"]
pub struct Pending<T> {
    rx: Receiver<Result<T, CommError>>,
}

impl<T> Pending<T> {
    /// A handle whose result comes through the sender (from the thread that
    /// runs the op); a sender dropped unsent yields [`CommError::Broken`].
    pub fn channel() -> (Sender<Result<T, CommError>>, Self) {
        let (tx, rx) = channel();
        (tx, Pending { rx })
    }

    /// A result that is already there.
    pub fn ready(result: Result<T, CommError>) -> Self {
        let (tx, rx) = channel();
        let _ = tx.send(result);
        Pending { rx }
    }

    /// Blocks until the op completes.
    pub fn wait(self) -> Result<T, CommError> {
        self.rx.recv().unwrap_or_else(|_| {
            Err(CommError::Broken { cause: "the communicator was dropped before the op ran".into() })
        })
    }

    /// The result if the op has completed, else the handle back.
    pub fn try_wait(self) -> Result<Result<T, CommError>, Self> {
        match self.rx.try_recv() {
            Ok(r) => Ok(r),
            Err(std::sync::mpsc::TryRecvError::Empty) => Err(self),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                Ok(Err(CommError::Broken { cause: "the communicator was dropped before the op ran".into() }))
            }
        }
    }
}

/// Collective operations across the ranks of a data-parallel job: the one seam
/// between a trainer and its transport.
///
/// Every op is checked across ranks before data moves: name, dtype, shape, reduce
/// op, scale factors and root must agree, or every rank gets the same
/// [`CommError::Mismatch`] and the communicator stays usable. Ops must be called
/// in the same order on every rank.
pub trait Collective: Send + Sync {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// In-place all-reduce.
    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError>;
    /// In-place broadcast from `root`; the root's tensor is not modified.
    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError>;
    /// Gathers every rank's tensor; first dimensions may differ, the rest must agree.
    fn all_gather(&self, name: &str, shape: &[usize], data: TensorRef<'_>) -> Result<Gathered, CommError>;
    /// Reduces across ranks and returns this rank's slice of the first dimension
    /// (split as evenly as possible, lower ranks taking one more row).
    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<Gathered, CommError>;
    /// Waits until every rank reaches the barrier.
    fn barrier(&self, name: &str) -> Result<(), CommError>;

    /// How the ranks' bytes move, for reports: `"shm"`, `"hierarchical"` or
    /// `"tcp"` for drove-comm's communicator, `"none"` by default (one rank,
    /// or a collective that does not say).
    fn transport(&self) -> &'static str {
        "none"
    }

    /// Checks that every rank is about to run the op `desc` describes, without
    /// moving its data: the description exchange every op of this trait starts
    /// with, for a backend whose data moves elsewhere (NCCL on a GPU). On a
    /// mismatch every rank gets the same [`CommError::Mismatch`] (or
    /// [`CommError::Invalid`] naming the ranks whose `problem` is set).
    ///
    /// The default gathers the encoded descriptions with [`Collective::all_gather`];
    /// the CPU communicator sends them as its own ops do, in one exchange.
    fn agree(&self, desc: &OpDesc) -> Result<(), CommError> {
        let spec = desc;
        let mut mine = desc.clone();
        mine.seq = 0;
        let encoded = mine.encode();
        let mut words = vec![0i32; encoded.len().div_ceil(4) + 1];
        words[0] = encoded.len() as i32;
        bytemuck::cast_slice_mut::<i32, u8>(&mut words[1..])[..encoded.len()].copy_from_slice(&encoded);
        let gathered = self.all_gather(
            &format!("agree {}", spec.label()),
            &[words.len()],
            crate::Element::tensor_ref(&words[..]),
        )?;
        let all: Vec<i32> = <i32 as crate::Element>::from_buffer(gathered.data).ok_or_else(|| {
            CommError::Invalid { op: spec.label(), message: "the gathered descriptions are not i32".into() }
        })?;
        let mut descs = Vec::with_capacity(gathered.first_dims.len());
        let mut at = 0;
        for (r, &n) in gathered.first_dims.iter().enumerate() {
            let words = &all[at..at + n];
            at += n;
            let len = words.first().copied().unwrap_or(0).max(0) as usize;
            let bytes: &[u8] = bytemuck::cast_slice(&words[1..]);
            let d = bytes.get(4..len).and_then(OpDesc::decode).ok_or_else(|| CommError::PeerLost {
                op: spec.label(),
                ranks: vec![r],
                detail: "sent an op description that does not decode (a different drove version?)".into(),
            })?;
            descs.push(d);
        }
        crate::transport::agree(&descs)
    }

    /// All-reduce of an owned buffer, returning at once; the default runs it now.
    fn all_reduce_async(
        &self,
        name: &str,
        shape: &[usize],
        mut data: Buffer,
        opts: ReduceOptions,
    ) -> Pending<Buffer> {
        Pending::ready(self.all_reduce(name, shape, data.as_mut(), opts).map(|()| data))
    }

    /// Broadcast of an owned buffer, returning at once; the default runs it now.
    fn broadcast_async(&self, name: &str, shape: &[usize], mut data: Buffer, root: usize) -> Pending<Buffer> {
        Pending::ready(self.broadcast(name, shape, data.as_mut(), root).map(|()| data))
    }
}

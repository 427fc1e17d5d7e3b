//! [`Delegate`]: a collective that hands every op to another one, written
//! once: an elastic member's current world, a wrapper that records its
//! calls, a test's swappable communicator.

use crate::collective::{Collective, Gathered, Pending};
use crate::dtype::{Buffer, TensorMut, TensorRef};
use crate::error::CommError;
use crate::op::ReduceOptions;
use crate::op::{OpDesc, OpKind};
use crate::place::Place;

/// How a delegated call uses the collective it is handed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallMode {
    /// The op runs to its end within the call.
    Blocking,
    /// Only the agreement round of an op ([`Collective::agree`]).
    Agreement,
    /// An async op is started; its [`Pending`] comes back at once.
    Started,
}

/// One call a [`Delegate`] hands on: which op, under which name, how.
#[derive(Clone, Copy, Debug)]
pub struct Call<'a> {
    /// The collective.
    pub kind: OpKind,
    /// The op's name.
    pub name: &'a str,
    /// How it runs.
    pub mode: CallMode,
}

impl Call<'_> {
    /// The label errors and timelines use, e.g. `all_reduce "grad"` is
    /// `all_reduce grad` here (as a span's name).
    pub fn span_name(&self) -> String {
        format!("{} {}", self.kind, self.name)
    }
}

/// A collective that runs every op on another [`Collective`] it holds or
/// finds: implement `place` and `delegate`, and every method of
/// `Collective` is forwarded (a blanket impl), async ops included, so a
/// wrapper cannot forget one or forward it wrongly.
pub trait Delegate: Send + Sync {
    /// This rank and its world.
    fn place(&self) -> Place;

    /// Runs `run` on the collective that does the work now; an error when
    /// there is none (say between two worlds of an elastic run).
    fn delegate<R>(
        &self,
        call: Call<'_>,
        run: impl FnOnce(&dyn Collective) -> Result<R, CommError>,
    ) -> Result<R, CommError>;

    /// How the bytes move (see [`Collective::transport`]); by default
    /// "none".
    fn delegate_transport(&self) -> &'static str {
        "none"
    }
}

fn call(kind: OpKind, name: &str) -> Call<'_> {
    Call { kind, name, mode: CallMode::Blocking }
}

impl<T: Delegate> Collective for T {
    fn rank(&self) -> usize {
        self.place().rank().get()
    }

    fn world_size(&self) -> usize {
        self.place().world().get()
    }

    fn transport(&self) -> &'static str {
        self.delegate_transport()
    }

    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        self.delegate(call(OpKind::AllReduce, name), |c| c.all_reduce(name, shape, data, opts))
    }

    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        self.delegate(call(OpKind::Broadcast, name), |c| c.broadcast(name, shape, data, root))
    }

    fn all_gather(&self, name: &str, shape: &[usize], data: TensorRef<'_>) -> Result<Gathered, CommError> {
        self.delegate(call(OpKind::AllGather, name), |c| c.all_gather(name, shape, data))
    }

    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<Gathered, CommError> {
        self.delegate(call(OpKind::ReduceScatter, name), |c| c.reduce_scatter(name, shape, data, opts))
    }

    fn barrier(&self, name: &str) -> Result<(), CommError> {
        self.delegate(call(OpKind::Barrier, name), |c| c.barrier(name))
    }

    fn agree(&self, desc: &OpDesc) -> Result<(), CommError> {
        let call = Call { kind: desc.kind, name: &desc.name, mode: CallMode::Agreement };
        self.delegate(call, |c| c.agree(desc))
    }

    fn all_reduce_async(
        &self,
        name: &str,
        shape: &[usize],
        data: Buffer,
        opts: ReduceOptions,
    ) -> Pending<Buffer> {
        let call = Call { kind: OpKind::AllReduce, name, mode: CallMode::Started };
        self.delegate(call, |c| Ok(c.all_reduce_async(name, shape, data, opts)))
            .unwrap_or_else(|e| Pending::ready(Err(e)))
    }

    fn broadcast_async(&self, name: &str, shape: &[usize], data: Buffer, root: usize) -> Pending<Buffer> {
        let call = Call { kind: OpKind::Broadcast, name, mode: CallMode::Started };
        self.delegate(call, |c| Ok(c.broadcast_async(name, shape, data, root)))
            .unwrap_or_else(|e| Pending::ready(Err(e)))
    }
}

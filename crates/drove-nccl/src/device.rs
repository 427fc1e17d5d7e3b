//! The device call: the one layer that differs between NCCL on a GPU and the
//! in-process stand-in. [`DeviceComm`](crate::DeviceComm) drives it; everything
//! above it (the id exchange, the description check, the deadline and the
//! abort) is the same code on both.

use drove_collective::{DType, ReduceOp};

/// The 128-byte id that joins the ranks of one communicator (NCCL's
/// `ncclUniqueId`). Rank 0 creates it; the others receive it over the CPU mesh.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let head: String = self.0[..8].iter().map(|b| format!("{b:02x}")).collect();
        write!(f, "UniqueId({head}..)")
    }
}

/// One collective as the device runs it: raw device addresses and element
/// counts. `count` is the element count of the buffer the op is named by in
/// NCCL's API (all of it for all-reduce and broadcast; one rank's part for
/// all-gather and reduce-scatter).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeviceCall {
    /// `recv = op(send of every rank)`; `send == recv` is in place.
    AllReduce {
        /// Input address.
        send: u64,
        /// Output address.
        recv: u64,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DType,
        /// The combining op.
        op: ReduceOp,
    },
    /// `recv = send of root`.
    Broadcast {
        /// Input address (read on the root).
        send: u64,
        /// Output address.
        recv: u64,
        /// Elements.
        count: usize,
        /// Element type.
        dtype: DType,
        /// The root rank.
        root: usize,
    },
    /// `recv[r * count..][..count] = send of rank r`.
    AllGather {
        /// Input address (`count` elements).
        send: u64,
        /// Output address (`world * count` elements).
        recv: u64,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DType,
    },
    /// `recv = op(send of every rank)[rank * count..][..count]`.
    ReduceScatter {
        /// Input address (`world * count` elements).
        send: u64,
        /// Output address (`count` elements).
        recv: u64,
        /// Elements per rank.
        count: usize,
        /// Element type.
        dtype: DType,
        /// The combining op.
        op: ReduceOp,
    },
    /// Every rank reaches it (NCCL has none: a one-element all-reduce on a
    /// scratch buffer of the device's own).
    Barrier,
}

/// A failure of the GPU libraries under the device layer: NCCL or the CUDA
/// driver cannot be loaded, or one of their calls failed (the in-process
/// stand-in reports its own failures as such calls). Named apart from
/// drove-device's `DeviceError`, which is what opening and using a training
/// device fails with.
#[derive(Debug, thiserror::Error)]
pub enum GpuLibraryError {
    /// A shared library the device needs cannot be loaded.
    #[error("{library} cannot be loaded: {hint}")]
    MissingLibrary {
        /// The library, e.g. `libnccl.so`.
        library: &'static str,
        /// What to install or set.
        hint: String,
    },
    /// A device call returned an error.
    #[error("{call}: {message}")]
    Call {
        /// The call, e.g. `ncclAllReduce`.
        call: String,
        /// Its error, as the library names it.
        message: String,
    },
}

impl GpuLibraryError {
    /// A failed `call` with `message`.
    pub fn call(call: impl Into<String>, message: impl std::fmt::Display) -> Self {
        GpuLibraryError::Call { call: call.into(), message: message.to_string() }
    }
}

/// The device side of a communicator, non-blocking: calls enqueue work and
/// return; [`Device::poll`] says whether the last of it has finished.
///
/// [`DeviceComm`](crate::DeviceComm) calls these in a fixed order:
/// `unique_id` (rank 0 only), `init`, `poll` until done, then per op `launch`
/// and `poll` until done, and `abort` when a deadline passes or a call fails.
pub trait Device: Send {
    /// Creates the id that joins the communicator (called on rank 0 only).
    fn unique_id(&mut self) -> Result<UniqueId, GpuLibraryError>;
    /// Starts joining communicator `id` as `rank` of `world`.
    fn init(&mut self, id: &UniqueId, world: usize, rank: usize) -> Result<(), GpuLibraryError>;
    /// Enqueues `call`.
    ///
    /// # Safety
    /// Every address in `call` must be valid device memory for the element
    /// counts it names until [`Device::poll`] reports the call done (or the
    /// device is aborted), and must not be written by other work meanwhile.
    unsafe fn launch(&mut self, call: &DeviceCall) -> Result<(), GpuLibraryError>;
    /// Whether the last `init` or `launch` has finished (`Ok(false)`: not yet).
    fn poll(&mut self) -> Result<bool, GpuLibraryError>;
    /// Aborts the communicator: pending work ends; the device is unusable after.
    fn abort(&mut self);
    /// What this device is, for messages (e.g. `NCCL 2.28.9 on cuda:0`).
    fn describe(&self) -> String;
}

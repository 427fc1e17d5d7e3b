//! [`DeviceComm`]: the control logic around a [`Device`], the same for NCCL
//! and for the in-process stand-in.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use drove_collective::{Collective, CommError, DType, Element, OpDesc, OpKind, ReduceOptions};

use crate::device::{Device, DeviceCall, GpuLibraryError, UniqueId};

/// A failure of a device collective.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The same errors the CPU backend gives: a mismatch or bad argument found
    /// by the description check (recoverable), a deadline that passed (naming
    /// the ranks waited for), lost ranks, or a communicator broken before.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// The device layer failed on this rank.
    #[error("{op}: {source}")]
    Device {
        /// The op, e.g. `all_reduce "gradients.bucket0"`.
        op: String,
        /// The device's error.
        #[source]
        source: GpuLibraryError,
    },
}

impl Error {
    /// Whether the communicator can be used after this error.
    pub fn is_recoverable(&self) -> bool {
        matches!(self, Error::Comm(e) if e.is_recoverable())
    }
}

/// Settings of a [`DeviceComm`].
#[derive(Clone, Debug)]
pub struct DeviceOptions {
    /// A device op (or joining) not finished after this long aborts the
    /// communicator (default 30 s, the CPU backend's deadline).
    pub timeout: Duration,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        DeviceOptions { timeout: Duration::from_secs(30) }
    }
}

/// A tensor in device memory: its address, element count and type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSlice {
    /// Device address of the first element.
    pub ptr: u64,
    /// Number of elements.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
}

struct Inner<D> {
    device: D,
    broken: Option<String>,
}

/// A device communicator for one rank: collectives on device memory, each
/// checked over the CPU mesh before the device runs it.
///
/// - **Joining**: rank 0's device creates the [`UniqueId`]; it reaches the
///   others by a broadcast over the mesh; all join, and an all-gather over the
///   mesh tells every rank whether every rank joined.
/// - **Agreement**: before each op, [`Collective::agree`] exchanges its
///   description over the mesh, so ranks that call different ops (which would
///   hang NCCL) all fail with the CPU backend's [`CommError::Mismatch`], before
///   the device is touched; the communicator stays usable.
/// - **Deadlines**: the device is polled, never waited on; past
///   [`DeviceOptions::timeout`] it is aborted, and an exchange over the mesh
///   finds which ranks did not come: the error is the CPU backend's
///   [`CommError::Timeout`] (or [`CommError::PeerLost`]) naming them.
pub struct DeviceComm<D: Device> {
    inner: Mutex<Inner<D>>,
    rank: usize,
    world: usize,
    opts: DeviceOptions,
}

const ID_WORDS: usize = 32;

impl<D: Device> DeviceComm<D> {
    /// Joins the device communicator of every rank of `mesh`.
    pub fn connect(mesh: &dyn Collective, mut device: D, opts: DeviceOptions) -> Result<Self, Error> {
        let (rank, world) = (mesh.rank(), mesh.world_size());
        let id = exchange_id(mesh, &mut device)?;
        let joined = device.init(&id, world, rank).and_then(|()| wait(&mut device, opts.timeout));
        let (status, local) = match joined {
            Ok(true) => (0, None),
            Ok(false) => (1, None),
            Err(e) => (2, Some(e)),
        };
        if status != 0 {
            device.abort();
        }
        let statuses = gather_i32(mesh, "device communicator: joined", status)?;
        if let Some(source) = local {
            return Err(Error::Device { op: "device communicator: joining".into(), source });
        }
        let failed: Vec<usize> = (0..world).filter(|&r| statuses[r] == 2).collect();
        let late: Vec<usize> = (0..world).filter(|&r| statuses[r] == 1).collect();
        if !failed.is_empty() || !late.is_empty() {
            let mut parts = Vec::new();
            if !failed.is_empty() {
                parts.push(format!("rank(s) {failed:?} failed to join (their errors say why)"));
            }
            if !late.is_empty() {
                parts.push(format!("rank(s) {late:?} were still joining after {:.1?}", opts.timeout));
            }
            return Err(Error::Comm(CommError::Rendezvous(format!(
                "the device communicator of {world} ranks did not form: {}",
                parts.join("; ")
            ))));
        }
        tracing::debug!("rank {rank}/{world}: device communicator on {}", device.describe());
        Ok(DeviceComm { inner: Mutex::new(Inner { device, broken: None }), rank, world, opts })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// What the device is.
    pub fn describe(&self) -> String {
        self.lock().device.describe()
    }

    /// Aborts the communicator (NCCL's `ncclCommAbort`): for one whose world
    /// ended, where finalizing would wait for members that may be gone.
    pub fn abort(self) {
        let mut inner = self.inner.into_inner().unwrap_or_else(|e| e.into_inner());
        inner.device.abort();
    }

    /// Runs `f` on the device (for example to read its stream).
    pub fn with_device<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.lock().device)
    }

    fn lock(&self) -> MutexGuard<'_, Inner<D>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In-place all-reduce of `data` (sum, average, min, max or product; no
    /// scale factors: scale the tensor on the device before or after).
    ///
    /// # Safety
    /// `data` must be valid device memory of its length and type for the call,
    /// not written by other work meanwhile (order by a host sync before it).
    pub unsafe fn all_reduce(
        &self,
        mesh: &dyn Collective,
        name: &str,
        data: DeviceSlice,
        opts: ReduceOptions,
    ) -> Result<(), Error> {
        let mut spec = OpDesc::new(OpKind::AllReduce, name, data.dtype, &[data.len]).reducing(opts);
        spec.problem = scale_problem(&opts);
        let call = DeviceCall::AllReduce {
            send: data.ptr,
            recv: data.ptr,
            count: data.len,
            dtype: data.dtype,
            op: opts.op,
        };
        // SAFETY: the caller's promise about `data`.
        unsafe { self.run(mesh, spec, call) }
    }

    /// In-place broadcast of `data` from `root`.
    ///
    /// # Safety
    /// As for [`DeviceComm::all_reduce`].
    pub unsafe fn broadcast(
        &self,
        mesh: &dyn Collective,
        name: &str,
        data: DeviceSlice,
        root: usize,
    ) -> Result<(), Error> {
        let mut spec = OpDesc::new(OpKind::Broadcast, name, data.dtype, &[data.len]).from_root(root);
        spec.problem = (root >= self.world)
            .then(|| format!("root {root} is out of range for world size {}", self.world));
        let call = DeviceCall::Broadcast {
            send: data.ptr,
            recv: data.ptr,
            count: data.len,
            dtype: data.dtype,
            root,
        };
        // SAFETY: the caller's promise about `data`.
        unsafe { self.run(mesh, spec, call) }
    }

    /// Gathers every rank's `send` into `recv` in rank order. Unlike the CPU
    /// backend every rank must send the same length (NCCL's rule).
    ///
    /// # Safety
    /// As for [`DeviceComm::all_reduce`], for both slices.
    pub unsafe fn all_gather(
        &self,
        mesh: &dyn Collective,
        name: &str,
        send: DeviceSlice,
        recv: DeviceSlice,
    ) -> Result<(), Error> {
        let mut spec = OpDesc::new(OpKind::AllGather, name, send.dtype, &[1, send.len]);
        spec.problem = pair_problem(send, recv, send.len.checked_mul(self.world), "world x the input");
        let call =
            DeviceCall::AllGather { send: send.ptr, recv: recv.ptr, count: send.len, dtype: send.dtype };
        // SAFETY: the caller's promise about both slices.
        unsafe { self.run(mesh, spec, call) }
    }

    /// Reduces `send` across ranks and writes this rank's equal part of the
    /// result to `recv` (`send.len` must be `world * recv.len`).
    ///
    /// # Safety
    /// As for [`DeviceComm::all_reduce`], for both slices.
    pub unsafe fn reduce_scatter(
        &self,
        mesh: &dyn Collective,
        name: &str,
        send: DeviceSlice,
        recv: DeviceSlice,
        opts: ReduceOptions,
    ) -> Result<(), Error> {
        let mut spec = OpDesc::new(OpKind::ReduceScatter, name, send.dtype, &[send.len]).reducing(opts);
        spec.problem = scale_problem(&opts)
            .or_else(|| pair_problem(recv, send, recv.len.checked_mul(self.world), "world x the output"));
        let call = DeviceCall::ReduceScatter {
            send: send.ptr,
            recv: recv.ptr,
            count: recv.len,
            dtype: send.dtype,
            op: opts.op,
        };
        // SAFETY: the caller's promise about both slices.
        unsafe { self.run(mesh, spec, call) }
    }

    /// Waits until every rank's device reaches the barrier.
    pub fn barrier(&self, mesh: &dyn Collective, name: &str) -> Result<(), Error> {
        let spec = OpDesc::new(OpKind::Barrier, name, DType::I32, &[]);
        // SAFETY: a barrier names no caller memory.
        unsafe { self.run(mesh, spec, DeviceCall::Barrier) }
    }

    /// Agreement, launch, and a bounded wait.
    unsafe fn run(&self, mesh: &dyn Collective, spec: OpDesc, call: DeviceCall) -> Result<(), Error> {
        let mut inner = self.lock();
        if let Some(cause) = &inner.broken {
            return Err(CommError::Broken { cause: cause.clone() }.into());
        }
        let label = spec.label();
        if mesh.rank() != self.rank || mesh.world_size() != self.world {
            return Err(CommError::Invalid {
                op: label,
                message: format!(
                    "the mesh is rank {} of {} but the device communicator was built as rank {} of {}",
                    mesh.rank(),
                    mesh.world_size(),
                    self.rank,
                    self.world
                ),
            }
            .into());
        }
        mesh.agree(&spec)?;
        // SAFETY: forwarded from the public op's contract.
        let outcome =
            unsafe { inner.device.launch(&call) }.and_then(|()| wait(&mut inner.device, self.opts.timeout));
        let error = match outcome {
            Ok(true) => return Ok(()),
            Ok(false) => {
                inner.device.abort();
                Error::Comm(stalled(mesh, &label, self.opts.timeout))
            }
            Err(source) => {
                inner.device.abort();
                Error::Device { op: label, source }
            }
        };
        inner.broken = Some(error.to_string());
        Err(error)
    }
}

/// Rank 0 creates the id; a broadcast over the mesh carries it (with whether
/// it could be made) to every rank.
fn exchange_id<D: Device>(mesh: &dyn Collective, device: &mut D) -> Result<UniqueId, Error> {
    let mut frame = [0i32; ID_WORDS + 1];
    let mut local = None;
    if mesh.rank() == 0 {
        match device.unique_id() {
            Ok(id) => {
                frame[0] = 1;
                for (w, chunk) in frame[1..].iter_mut().zip(id.0.chunks_exact(4)) {
                    *w = i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                }
            }
            Err(e) => local = Some(e),
        }
    }
    mesh.broadcast("device communicator: unique id", &[frame.len()], i32::tensor_mut(&mut frame), 0)?;
    if let Some(source) = local {
        return Err(Error::Device { op: "device communicator: creating the unique id".into(), source });
    }
    if frame[0] != 1 {
        return Err(Error::Comm(CommError::Rendezvous(
            "rank 0 could not create the device communicator's unique id (its error says why)".into(),
        )));
    }
    let mut id = [0u8; 128];
    for (chunk, w) in id.chunks_exact_mut(4).zip(&frame[1..]) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    Ok(UniqueId(id))
}

fn gather_i32(mesh: &dyn Collective, name: &str, value: i32) -> Result<Vec<i32>, CommError> {
    let g = mesh.all_gather(name, &[1], i32::tensor_ref(&[value]))?;
    i32::from_buffer(g.data)
        .ok_or_else(|| CommError::Invalid { op: name.into(), message: "gathered values are not i32".into() })
}

/// Polls `device` until its last call is done (`Ok(true)`) or `timeout`
/// passes (`Ok(false)`). Spins briefly (device ops take microseconds), then
/// backs off to sleeps of at most 200 us.
fn wait<D: Device>(device: &mut D, timeout: Duration) -> Result<bool, GpuLibraryError> {
    let deadline = Instant::now() + timeout;
    let mut polls = 0u32;
    loop {
        if device.poll()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        polls += 1;
        if polls < 256 {
            std::hint::spin_loop();
        } else if polls < 1024 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// After a device deadline: which ranks did not come? Every rank that timed
/// out answers an all-gather over the mesh; the mesh's own deadline names the
/// ranks that do not (stopped, hung, or gone). If every rank answers, none can
/// be blamed more than another: the error names all the others.
fn stalled(mesh: &dyn Collective, label: &str, after: Duration) -> CommError {
    let others = || (0..mesh.world_size()).filter(|&r| r != mesh.rank()).collect::<Vec<_>>();
    match gather_i32(mesh, &format!("{label}: device deadline"), 0) {
        Err(CommError::Timeout { ranks, .. }) => CommError::Timeout { op: label.into(), ranks, after },
        Err(CommError::PeerLost { ranks, detail, .. }) => {
            CommError::PeerLost { op: label.into(), ranks, detail }
        }
        Err(_) | Ok(_) => CommError::Timeout { op: label.into(), ranks: others(), after },
    }
}

fn scale_problem(opts: &ReduceOptions) -> Option<String> {
    (opts.prescale != 1.0 || opts.postscale != 1.0).then(|| {
        format!(
            "the device backend takes no scale factors (prescale {}, postscale {}): scale the tensor on the device",
            opts.prescale, opts.postscale
        )
    })
}

fn pair_problem(small: DeviceSlice, large: DeviceSlice, want: Option<usize>, what: &str) -> Option<String> {
    if small.dtype != large.dtype {
        return Some(format!("input is {} but output is {}", small.dtype, large.dtype));
    }
    match want {
        Some(n) if n == large.len => None,
        _ => Some(format!("the larger buffer holds {} elements, expected {what} ({want:?})", large.len)),
    }
}

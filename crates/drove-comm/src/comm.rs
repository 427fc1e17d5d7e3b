//! The `Collective` trait and the CPU communicator that implements it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::Deadlines;
use crate::desc::{OpDesc, OpKind};
use crate::dtype::{Buffer, DType, ReduceOp, TensorMut, TensorRef, scale_bytes};
use crate::engine::{Engine, Reduction, split};
use crate::error::CommError;
use crate::liveness::{DEFAULT_HANG_LIMIT, Liveness};
use crate::mesh::Mesh;
use crate::place::Place;
use crate::profile::{RingProfile, RingStep};
use crate::rendezvous::{FileRendezvous, PeerTable, Rendezvous, StaticRendezvous};
use crate::spec::OpSpec;

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

    /// How the ranks' bytes move, for reports: `"shm"`, `"hierarchical"` or `"tcp"` for a
    /// [`Communicator`], `"none"` by default (one rank, or a collective
    /// that does not say).
    fn transport(&self) -> &'static str {
        "none"
    }

    /// Checks that every rank is about to run the op `spec` describes, without
    /// moving its data: the description exchange every op of this trait starts
    /// with, for a backend whose data moves elsewhere (NCCL on a GPU). On a
    /// mismatch every rank gets the same [`CommError::Mismatch`] (or
    /// [`CommError::Invalid`] naming the ranks whose `problem` is set).
    ///
    /// The default gathers the encoded descriptions with [`Collective::all_gather`];
    /// the CPU communicator sends them as its own ops do, in one exchange.
    fn agree(&self, spec: &OpSpec) -> Result<(), CommError> {
        let mut mine = spec.desc();
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
        crate::desc::check(&descs)
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

/// Which transport carries the data. A host is a kernel and a network
/// namespace (or `DROVE_HOST_ID`, where set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory when every rank is on one host; the hierarchical
    /// all-reduce when some ranks share a host and others do not; the TCP
    /// ring when no two do (or shared memory cannot be set up).
    Auto,
    /// Always the flat TCP ring.
    Tcp,
    /// As `Auto`, but a world of several hosts that cannot set up shared
    /// memory on each fails to connect, naming the ranks, instead of falling
    /// back to the ring (a world on one host falls back as with `Auto`).
    Hierarchical,
}

impl Transport {
    /// The setting's name, as `DROVE_COMM_TRANSPORT` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Tcp => "tcp",
            Transport::Hierarchical => "hierarchical",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "shm" => Ok(Transport::Auto),
            "tcp" | "flat" => Ok(Transport::Tcp),
            "hierarchical" => Ok(Transport::Hierarchical),
            other => Err(format!("unknown transport {other:?}: expected auto, tcp or hierarchical")),
        }
    }
}

/// Communicator settings.
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// An op that has not completed after this long fails, naming the ranks it
    /// waits for (default 30 s).
    pub timeout: Duration,
    /// A warning names the ranks waited for after this long (default 10 s).
    pub warn_after: Duration,
    /// Time allowed to find and connect to every peer (default 60 s).
    pub connect_timeout: Duration,
    /// Data transport.
    pub transport: Transport,
    /// Bytes per shared-memory staging buffer (default 1 MiB).
    pub shm_chunk: usize,
    /// Which peers that keep an op waiting past `timeout` show no sign of
    /// life (an elastic run's heartbeats): those fail the op at the deadline,
    /// live ones are waited for up to `hang_limit`. `None` (the default):
    /// the deadline is final.
    pub liveness: Option<Arc<dyn Liveness>>,
    /// How long an op waits for peers that are alive (see `liveness`) before
    /// it fails naming them (default 10 minutes).
    pub hang_limit: Duration,
    /// Test hook: the process kills itself (SIGKILL) after moving this many bytes.
    #[doc(hidden)]
    pub fault_kill_after_bytes: Option<u64>,
}

impl CommOptions {
    pub(crate) fn deadlines(&self) -> Deadlines {
        Deadlines {
            timeout: self.timeout,
            warn_after: self.warn_after,
            liveness: self.liveness.clone(),
            hang_limit: self.hang_limit.max(self.timeout),
        }
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(30),
            warn_after: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(60),
            transport: Transport::Auto,
            shm_chunk: 1 << 20,
            liveness: None,
            hang_limit: DEFAULT_HANG_LIMIT,
            fault_kill_after_bytes: None,
        }
    }
}

impl CommOptions {
    /// Defaults, overridden by `DROVE_COMM_TIMEOUT`, `DROVE_COMM_WARN_AFTER`
    /// and `DROVE_COMM_HANG_LIMIT` (seconds) and `DROVE_COMM_TRANSPORT`
    /// (`auto`, `tcp` or `hierarchical`).
    pub fn from_env() -> Result<Self, CommError> {
        let mut o = CommOptions::default();
        let secs = |name: &str| -> Result<Option<Duration>, CommError> {
            match std::env::var(name) {
                Ok(v) => v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .map(|s| Some(Duration::from_secs_f64(s)))
                    .ok_or_else(|| {
                        CommError::Rendezvous(format!("{name}={v:?} is not a positive number of seconds"))
                    }),
                Err(_) => Ok(None),
            }
        };
        if let Some(t) = secs("DROVE_COMM_TIMEOUT")? {
            o.timeout = t;
            o.warn_after = o.warn_after.min(t / 3);
        }
        if let Some(t) = secs("DROVE_COMM_WARN_AFTER")? {
            o.warn_after = t;
        }
        if let Some(t) = secs("DROVE_COMM_HANG_LIMIT")? {
            o.hang_limit = t;
        }
        if let Ok(v) = std::env::var("DROVE_COMM_TRANSPORT") {
            o.transport = v.parse().map_err(CommError::Rendezvous)?;
        }
        Ok(o)
    }
}

struct State {
    serving: u64,
    engine: Engine,
}

struct Shared {
    place: Place,
    transport: &'static str,
    next_ticket: AtomicU64,
    state: Mutex<State>,
    turn: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::SeqCst)
    }

    /// Runs `f` on the engine when ticket `t` is served: ops run in the order
    /// their tickets were taken, whichever thread runs them.
    fn run<R>(&self, t: u64, f: impl FnOnce(&mut Engine) -> R) -> R {
        let mut st = self.lock();
        while st.serving != t {
            st = self.turn.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        struct Advance<'a>(&'a Shared, MutexGuard<'a, State>);
        impl Drop for Advance<'_> {
            fn drop(&mut self) {
                self.1.serving += 1;
                self.0.turn.notify_all();
            }
        }
        let mut guard = Advance(self, st);
        f(&mut guard.1.engine)
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The CPU communicator: shared memory between ranks on one host, a TCP ring
/// otherwise. Ops run in call order; async ops run on a background thread.
pub struct Communicator {
    shared: Arc<Shared>,
    jobs: Mutex<Option<Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

fn product(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

fn shape_problem(shape: &[usize], len: usize) -> Option<String> {
    match product(shape) {
        Some(n) if n == len => None,
        Some(n) => Some(format!("shape {shape:?} holds {n} elements but the tensor has {len}")),
        None => Some(format!("shape {shape:?} overflows")),
    }
}

fn scale_problem(dtype: DType, opts: &ReduceOptions) -> Option<String> {
    if !dtype.is_float() && (opts.prescale != 1.0 || opts.postscale != 1.0) {
        return Some(format!(
            "scale factors apply to floating-point tensors only (found {dtype} with prescale {} and postscale {})",
            opts.prescale, opts.postscale
        ));
    }
    if !opts.prescale.is_finite() || !opts.postscale.is_finite() {
        return Some(format!(
            "scale factors must be finite (prescale {}, postscale {})",
            opts.prescale, opts.postscale
        ));
    }
    None
}

fn desc(kind: OpKind, name: &str, dtype: DType, shape: &[usize]) -> OpDesc {
    OpDesc {
        seq: 0,
        kind,
        name: name.to_string(),
        dtype,
        shape: shape.iter().map(|&d| d as u64).collect(),
        reduce: None,
        prescale: 1.0,
        postscale: 1.0,
        root: 0,
        problem: String::new(),
    }
}

impl Communicator {
    /// Finds the other ranks through `rendezvous` and connects to them.
    pub fn connect(rendezvous: &dyn Rendezvous, opts: CommOptions) -> Result<Communicator, CommError> {
        let world = rendezvous.world_size();
        let deadline = Instant::now() + opts.connect_timeout;
        let bind = rendezvous.bind_addr();
        let listener =
            std::net::TcpListener::bind(bind).map_err(|e| CommError::io(format!("binding {bind}"), e))?;
        let local = listener.local_addr().map_err(|e| CommError::io("reading the listener's address", e))?;
        let table = rendezvous.exchange(local, deadline)?;
        if table.place().world() != world {
            return Err(CommError::Rendezvous(format!(
                "the rendezvous gave rank {} and {} addresses for world size {world}",
                table.place().rank(),
                table.addrs().len()
            )));
        }
        Self::with_table(listener, &table, 0, &opts, deadline)
    }

    /// Connects to the peers of `table` (this rank's listener already bound
    /// at its address there), as world `generation` of an elastic run (0: a
    /// fixed world): peers greeting from another generation are refused.
    pub(crate) fn with_table(
        listener: std::net::TcpListener,
        table: &PeerTable,
        generation: u64,
        opts: &CommOptions,
        deadline: Instant,
    ) -> Result<Communicator, CommError> {
        let place = table.place();
        let (rank, world, addrs) = (place.rank().get(), place.world().get(), table.addrs());
        let mut mesh = Mesh::connect(generation, rank, world, &listener, addrs, deadline)?;
        drop(listener);
        let layout = crate::hosts::setup(&mut mesh, opts, deadline)?;
        let engine = Engine::new(mesh, layout, opts.deadlines(), opts.fault_kill_after_bytes);
        let transport = engine.transport();
        tracing::info!(rank, world, "communicator connected: data moves over {transport}");
        let shared = Arc::new(Shared {
            place,
            transport,
            next_ticket: AtomicU64::new(0),
            state: Mutex::new(State { serving: 0, engine }),
            turn: Condvar::new(),
        });
        let (tx, rx) = channel::<Job>();
        let worker = std::thread::Builder::new()
            .name(format!("drove-comm-{rank}"))
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .map_err(|e| CommError::io("starting the communicator thread", e))?;
        Ok(Communicator { shared, jobs: Mutex::new(Some(tx)), worker: Mutex::new(Some(worker)) })
    }

    /// Connects using the environment: `DROVE_COORDINATOR` (with the
    /// `coordinator` feature) if set, else `DROVE_RENDEZVOUS_DIR` (a shared
    /// directory), else `DROVE_PEERS` or `DROVE_PEERS_FILE`; options from
    /// [`CommOptions::from_env`].
    pub fn from_env() -> Result<Communicator, CommError> {
        let opts = CommOptions::from_env()?;
        #[cfg(feature = "coordinator")]
        if std::env::var_os("DROVE_COORDINATOR").is_some() {
            return Self::connect(&crate::coordinator::CoordinatorRendezvous::from_env()?, opts);
        }
        if std::env::var_os("DROVE_RENDEZVOUS_DIR").is_some() {
            Self::connect(&FileRendezvous::from_env()?, opts)
        } else {
            Self::connect(&StaticRendezvous::from_env()?, opts)
        }
    }

    /// This rank in its world ([`Collective::rank`] and
    /// [`Collective::world_size`] as one checked value).
    pub fn place(&self) -> Place {
        self.shared.place
    }

    /// The transport in use: `"shm"`, `"hierarchical"` or `"tcp"`.
    pub fn transport(&self) -> &'static str {
        self.shared.transport
    }

    /// Starts (`true`, from nothing) or stops profiling the TCP ring's steps
    /// (see [`RingStep`]), in call order with the ops; over shared memory
    /// nothing is recorded.
    pub fn set_ring_profile(&self, on: bool) {
        self.shared.run(self.shared.ticket(), |e| e.profile = on.then(RingProfile::default));
    }

    /// The ring's steps profiled since profiling started, and starts over
    /// (empty when it is not profiled).
    pub fn take_ring_profile(&self) -> Vec<RingStep> {
        self.shared.run(self.shared.ticket(), |e| match e.profile.as_mut() {
            Some(p) => std::mem::take(p).into_steps(),
            None => Vec::new(),
        })
    }

    fn submit(&self, job: Job) -> Result<(), CommError> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        match jobs.as_ref() {
            Some(tx) => tx
                .send(job)
                .map_err(|_| CommError::Broken { cause: "the communicator thread stopped".into() }),
            None => Err(CommError::Broken { cause: "the communicator is shutting down".into() }),
        }
    }

    fn all_reduce_impl(
        engine: &mut Engine,
        name: &str,
        shape: &[usize],
        mut data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        let dtype = data.dtype();
        let mut d = desc(OpKind::AllReduce, name, dtype, shape);
        d.reduce = Some(opts.op);
        d.prescale = opts.prescale;
        d.postscale = opts.postscale;
        d.problem =
            shape_problem(shape, data.len()).or_else(|| scale_problem(dtype, &opts)).unwrap_or_default();
        let (mut clock, _) = engine.begin(d)?;
        let bytes = data.bytes_mut();
        if dtype.is_float() {
            scale_bytes(dtype, opts.prescale, bytes);
        }
        engine.all_reduce(bytes, Reduction { dtype, op: opts.op, postscale: opts.postscale }, &mut clock)
    }

    fn broadcast_impl(
        engine: &mut Engine,
        name: &str,
        shape: &[usize],
        mut data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        let world = engine.world();
        let mut d = desc(OpKind::Broadcast, name, data.dtype(), shape);
        d.root = root as u32;
        d.problem = shape_problem(shape, data.len())
            .or_else(|| {
                (root >= world).then(|| format!("root {root} is out of range for world size {world}"))
            })
            .unwrap_or_default();
        let (mut clock, _) = engine.begin(d)?;
        engine.broadcast(data.bytes_mut(), root, &mut clock)
    }
}

impl Collective for Communicator {
    fn rank(&self) -> usize {
        self.shared.place.rank().get()
    }

    fn transport(&self) -> &'static str {
        self.shared.transport
    }

    fn world_size(&self) -> usize {
        self.shared.place.world().get()
    }

    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        let t = self.shared.ticket();
        self.shared.run(t, |e| Self::all_reduce_impl(e, name, shape, data, opts))
    }

    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        let t = self.shared.ticket();
        self.shared.run(t, |e| Self::broadcast_impl(e, name, shape, data, root))
    }

    fn all_gather(&self, name: &str, shape: &[usize], data: TensorRef<'_>) -> Result<Gathered, CommError> {
        let t = self.shared.ticket();
        self.shared.run(t, |engine| {
            let dtype = data.dtype();
            let mut d = desc(OpKind::AllGather, name, dtype, shape);
            d.problem = if shape.is_empty() {
                "all_gather needs a tensor with at least one dimension".into()
            } else {
                shape_problem(shape, data.len()).unwrap_or_default()
            };
            let (mut clock, all) = engine.begin(d)?;
            let counts: Vec<usize> =
                all.iter().map(|d| d.shape.iter().product::<u64>() as usize * dtype.size()).collect();
            let first_dims: Vec<usize> = all.iter().map(|d| d.shape[0] as usize).collect();
            let mut out = Buffer::zeros(dtype, counts.iter().sum::<usize>() / dtype.size());
            engine.all_gather(data.bytes(), &counts, out.bytes_mut(), &mut clock)?;
            let mut out_shape = shape.to_vec();
            out_shape[0] = first_dims.iter().sum();
            Ok(Gathered { data: out, first_dims, shape: out_shape })
        })
    }

    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<Gathered, CommError> {
        let t = self.shared.ticket();
        self.shared.run(t, |engine| {
            let dtype = data.dtype();
            let world = engine.world();
            let mut d = desc(OpKind::ReduceScatter, name, dtype, shape);
            d.reduce = Some(opts.op);
            d.prescale = opts.prescale;
            d.postscale = opts.postscale;
            d.problem = if shape.is_empty() {
                "reduce_scatter needs a tensor with at least one dimension".into()
            } else {
                shape_problem(shape, data.len()).or_else(|| scale_problem(dtype, &opts)).unwrap_or_default()
            };
            let (mut clock, _) = engine.begin(d)?;
            let row: usize = shape[1..].iter().product();
            let rows = split(shape[0], world);
            let segs: Vec<_> = rows.iter().map(|r| r.start * row..r.end * row).collect();
            let mut input = Buffer::zeros(dtype, data.len());
            input.bytes_mut().copy_from_slice(data.bytes());
            if dtype.is_float() {
                scale_bytes(dtype, opts.prescale, input.bytes_mut());
            }
            let rank = engine.rank();
            let mut out = Buffer::zeros(dtype, segs[rank].len());
            let red = Reduction { dtype, op: opts.op, postscale: opts.postscale };
            engine.reduce_scatter(input.bytes_mut(), &segs, out.bytes_mut(), red, &mut clock)?;
            let mut out_shape = shape.to_vec();
            out_shape[0] = rows[rank].len();
            Ok(Gathered { data: out, first_dims: rows.iter().map(|r| r.len()).collect(), shape: out_shape })
        })
    }

    fn barrier(&self, name: &str) -> Result<(), CommError> {
        let t = self.shared.ticket();
        self.shared.run(t, |e| e.begin(desc(OpKind::Barrier, name, DType::I32, &[])).map(|_| ()))
    }

    fn agree(&self, spec: &OpSpec) -> Result<(), CommError> {
        let t = self.shared.ticket();
        self.shared.run(t, |e| e.begin(spec.desc()).map(|_| ()))
    }

    fn all_reduce_async(
        &self,
        name: &str,
        shape: &[usize],
        data: Buffer,
        opts: ReduceOptions,
    ) -> Pending<Buffer> {
        let (name, shape) = (name.to_string(), shape.to_vec());
        self.run_async(data, move |e, d| Self::all_reduce_impl(e, &name, &shape, d.as_mut(), opts))
    }

    fn broadcast_async(&self, name: &str, shape: &[usize], data: Buffer, root: usize) -> Pending<Buffer> {
        let (name, shape) = (name.to_string(), shape.to_vec());
        self.run_async(data, move |e, d| Self::broadcast_impl(e, &name, &shape, d.as_mut(), root))
    }
}

impl Communicator {
    /// Takes a ticket now (so the op keeps its place in the call order) and runs
    /// `op` on the background thread when the ticket is served.
    fn run_async(
        &self,
        mut data: Buffer,
        op: impl FnOnce(&mut Engine, &mut Buffer) -> Result<(), CommError> + Send + 'static,
    ) -> Pending<Buffer> {
        let t = self.shared.ticket();
        let (tx, rx) = channel();
        let shared = Arc::clone(&self.shared);
        let job: Job = Box::new(move || {
            let r = shared.run(t, |e| op(e, &mut data));
            let _ = tx.send(r.map(|()| data));
        });
        if let Err(e) = self.submit(job) {
            return Pending::ready(Err(e));
        }
        Pending { rx }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Finish queued async ops, then leave together, so that no rank closes its
        // connections while another is still in an op with it.
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = w.join();
        }
        let t = self.shared.ticket();
        self.shared.run(t, |e| {
            if e.broken.is_none()
                && e.world() > 1
                && let Err(err) = e.begin(desc(OpKind::Shutdown, "shutdown", DType::I32, &[]))
            {
                tracing::debug!("leaving the communicator: {err}");
            }
        });
    }
}

/// A world of one: every op is local. For single-process runs and tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        mut data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        let dtype = data.dtype();
        if let Some(problem) = shape_problem(shape, data.len()).or_else(|| scale_problem(dtype, &opts)) {
            return Err(CommError::Invalid { op: format!("all_reduce {name:?}"), message: problem });
        }
        if dtype.is_float() {
            let bytes = data.bytes_mut();
            scale_bytes(dtype, opts.prescale, bytes);
            crate::dtype::finish(dtype, opts.op, 1, opts.postscale, bytes);
        }
        Ok(())
    }
    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        if let Some(problem) = shape_problem(shape, data.len()) {
            return Err(CommError::Invalid { op: format!("broadcast {name:?}"), message: problem });
        }
        if root != 0 {
            return Err(CommError::Invalid {
                op: format!("broadcast {name:?}"),
                message: format!("root {root} is out of range for world size 1"),
            });
        }
        Ok(())
    }
    fn all_gather(&self, name: &str, shape: &[usize], data: TensorRef<'_>) -> Result<Gathered, CommError> {
        if let Some(problem) =
            shape_problem(shape, data.len()).or_else(|| shape.is_empty().then(|| "needs a dimension".into()))
        {
            return Err(CommError::Invalid { op: format!("all_gather {name:?}"), message: problem });
        }
        let mut out = Buffer::zeros(data.dtype(), data.len());
        out.bytes_mut().copy_from_slice(data.bytes());
        Ok(Gathered { data: out, first_dims: vec![shape[0]], shape: shape.to_vec() })
    }
    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<Gathered, CommError> {
        let mut g = self.all_gather(name, shape, data)?;
        self.all_reduce(name, shape, g.data.as_mut(), opts)?;
        Ok(g)
    }
    fn barrier(&self, _name: &str) -> Result<(), CommError> {
        Ok(())
    }
}

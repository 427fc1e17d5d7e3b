//! [`Communicator`], the CPU transport that implements drove-collective's
//! [`Collective`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use drove_collective::transport::reduce::{scale_bytes, split_rows as split};
use drove_collective::{
    Buffer, Collective, CommError, DType, Gathered, OpDesc, OpKind, Pending, ReduceOptions, TensorMut,
    TensorRef,
};

use crate::engine::Engine;
use crate::mesh::Mesh;
use crate::options::CommOptions;
use crate::profile::{RingProfile, RingStep};
use crate::reduction::Reduction;
use crate::rendezvous::{PeerTable, Rendezvous};
use drove_collective::Place;

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

fn desc(kind: OpKind, name: &str, dtype: DType, shape: &[usize]) -> OpDesc {
    OpDesc::new(kind, name, dtype, shape)
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
    pub fn with_table(
        listener: std::net::TcpListener,
        table: &PeerTable,
        generation: u64,
        opts: &CommOptions,
        deadline: Instant,
    ) -> Result<Communicator, CommError> {
        let place = table.place();
        let (rank, world, addrs) = (place.rank().get(), place.world().get(), table.addrs());
        let host = crate::host_id::host_id(opts.host_id.as_deref());
        let mut mesh = Mesh::connect(generation, rank, world, &listener, addrs, &host, deadline)?;
        drop(listener);
        let topology = crate::hosts::setup(&mut mesh, opts, deadline)?;
        let engine = Engine::new(mesh, topology, opts.deadlines(), opts.fault_kill_after_bytes);
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
        let d =
            desc(OpKind::AllReduce, name, dtype, shape).reducing(opts).checked(data.len(), engine.world());
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
        let d = desc(OpKind::Broadcast, name, data.dtype(), shape).from_root(root).checked(data.len(), world);
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
            let d = desc(OpKind::AllGather, name, dtype, shape).checked(data.len(), engine.world());
            let (mut clock, all) = engine.begin(d)?;
            let counts: Vec<usize> =
                all.iter().map(|d| d.shape.iter().product::<usize>() * dtype.size()).collect();
            let first_dims: Vec<usize> = all.iter().map(|d| d.shape[0]).collect();
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
            let d = desc(OpKind::ReduceScatter, name, dtype, shape).reducing(opts).checked(data.len(), world);
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

    fn agree(&self, desc: &OpDesc) -> Result<(), CommError> {
        let t = self.shared.ticket();
        self.shared.run(t, |e| e.begin(desc.clone()).map(|_| ()))
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
        let (tx, pending) = Pending::channel();
        let shared = Arc::clone(&self.shared);
        let job: Job = Box::new(move || {
            let r = shared.run(t, |e| op(e, &mut data));
            let _ = tx.send(r.map(|()| data));
        });
        if let Err(e) = self.submit(job) {
            return Pending::ready(Err(e));
        }
        pending
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

//! [`LocalWorld`]: the ranks of a world as threads of one process, meeting
//! in memory.
//!
//! For code above the seam (a trainer, an optimizer, a diagnostic) whose
//! tests need several ranks without a transport: each handle is one rank's
//! [`Collective`], ops are checked across ranks as every transport checks
//! them ([`agree`](crate::transport::agree)), reduced with the same kernels, and a rank
//! that does not come within the deadline fails the others, naming it. A rank
//! that [hangs up](LocalWorld::hang_up) fails them at once, naming it, as a
//! transport names a peer whose process died and closed its connections.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::collective::{Collective, Gathered};
use crate::dtype::{Buffer, DType, TensorMut, TensorRef};
use crate::error::CommError;
use crate::op::ReduceOptions;
use crate::op::{OpDesc, OpKind};
use crate::place::Place;
use crate::transport::agree;
use crate::transport::reduce::{Combine, combine_many, finish, scale_bytes, split_rows};

/// How long a rank waits for the others by default.
pub const DEFAULT_LOCAL_TIMEOUT: Duration = Duration::from_secs(60);

/// One rank of a world whose ranks are threads of this process.
#[derive(Debug)]
pub struct LocalWorld {
    room: Arc<Room>,
    place: Place,
    seq: AtomicU64,
}

#[derive(Debug)]
struct Room {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Each rank's part of the round being collected.
    arrived: Vec<Option<Part>>,
    /// The last round's results by rank, until every rank took its own.
    results: Option<Vec<Option<Outcome>>>,
    /// Why the world can no longer be used (a rank gave up waiting).
    broken: Option<String>,
    /// The ranks that hung up, in the order they did.
    gone: Vec<usize>,
}

#[derive(Debug)]
struct Part {
    desc: OpDesc,
    data: Vec<u8>,
}

/// One rank's result of a round.
type Outcome = Result<Gathered, CommError>;

impl LocalWorld {
    /// The `world` ranks of a new world, by rank, each waiting
    /// [`DEFAULT_LOCAL_TIMEOUT`] for the others; an error if `world` is 0.
    pub fn new(world: usize) -> Result<Vec<LocalWorld>, CommError> {
        Self::with_timeout(world, DEFAULT_LOCAL_TIMEOUT)
    }

    /// [`LocalWorld::new`] whose ranks wait `timeout` for each other.
    pub fn with_timeout(world: usize, timeout: Duration) -> Result<Vec<LocalWorld>, CommError> {
        Place::new(0, world)?;
        let state = State { arrived: (0..world).map(|_| None).collect(), ..State::default() };
        let room = Arc::new(Room { world, timeout, state: Mutex::new(state), changed: Condvar::new() });
        (0..world)
            .map(|rank| {
                Ok(LocalWorld {
                    room: Arc::clone(&room),
                    place: Place::new(rank, world)?,
                    seq: AtomicU64::new(0),
                })
            })
            .collect()
    }

    /// Leaves the world as a rank whose process dies does: every op a peer
    /// is waiting in for this rank, and every later one, fails at once with
    /// [`CommError::PeerLost`] naming this rank (and the op), instead of at
    /// the deadline; this rank's own later ops fail alike. For tests of a
    /// rank lost mid-step ([`fault::Faulty`](crate::fault::Faulty) calls it when
    /// a fault strikes). Call it between this rank's ops, not during one.
    pub fn hang_up(&self) {
        let rank = self.place.rank().get();
        let mut state = self.lock();
        if !state.gone.contains(&rank) {
            state.gone.push(rank);
        }
        // A result of the last round it did not take would hold up the next round.
        if let Some(results) = state.results.as_mut() {
            results[rank] = None;
            if results.iter().all(Option::is_none) {
                state.results = None;
            }
        }
        self.room.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.room.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one round: this rank's part in, its result out.
    fn round(&self, mut desc: OpDesc, data: Vec<u8>) -> Outcome {
        let rank = self.place.rank().get();
        desc.seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let label = desc.label();
        let deadline = Instant::now() + self.room.timeout;
        let mut state = self.lock();
        if state.gone.contains(&rank) {
            let detail = "this rank hung up (LocalWorld::hang_up) before the op".to_string();
            return Err(CommError::PeerLost { op: label, ranks: vec![rank], detail });
        }
        // The last round's results are still being taken.
        state = self.wait(state, deadline, &label, |s| s.results.is_none())?;
        state.arrived[rank] = Some(Part { desc, data });
        if state.arrived.iter().all(Option::is_some) {
            let parts: Vec<Part> = state.arrived.iter_mut().filter_map(Option::take).collect();
            state.results = Some(settle(&parts).into_iter().map(Some).collect());
            self.room.changed.notify_all();
        }
        state = self.wait(state, deadline, &label, |s| s.results.is_some())?;
        let results = state.results.as_mut().expect("waited for above");
        let mine = results[rank].take().expect("each rank takes its result once");
        if results.iter().all(Option::is_none) {
            state.results = None;
            self.room.changed.notify_all();
        }
        mine
    }

    /// Waits until `ready`, failing the world at the deadline.
    fn wait<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        deadline: Instant,
        label: &str,
        ready: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'a, State>, CommError> {
        loop {
            if let Some(cause) = &state.broken {
                return Err(CommError::Broken { cause: cause.clone() });
            }
            if ready(&state) {
                return Ok(state);
            }
            // A rank that hung up never comes: the op fails now, naming it.
            let lost: Vec<usize> =
                state.gone.iter().copied().filter(|&r| state.arrived[r].is_none()).collect();
            if !lost.is_empty() {
                let detail = "hung up (LocalWorld::hang_up), as a rank whose process died".to_string();
                return Err(CommError::PeerLost { op: label.to_string(), ranks: lost, detail });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let ranks: Vec<usize> =
                    (0..self.room.world).filter(|&r| state.arrived[r].is_none()).collect();
                state.broken = Some(format!("{label}: rank(s) {ranks:?} did not come"));
                self.room.changed.notify_all();
                return Err(CommError::Timeout { op: label.to_string(), ranks, after: self.room.timeout });
            }
            state = self.room.changed.wait_timeout(state, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Every rank's result of a round whose parts have all come.
fn settle(parts: &[Part]) -> Vec<Outcome> {
    let descs: Vec<OpDesc> = parts.iter().map(|p| p.desc.clone()).collect();
    if agree(&descs).is_err() {
        return parts.iter().map(|_| Err(agree(&descs).expect_err("failed above"))).collect();
    }
    let first = &descs[0];
    let (dtype, shape) = (first.dtype, first.shape.clone());
    let whole =
        |data: Vec<u8>| Gathered { data: buffer(dtype, data), first_dims: vec![], shape: shape.clone() };
    match first.kind {
        OpKind::AllReduce => {
            let sum = reduced(parts, first);
            parts.iter().map(|_| Ok(whole(sum.clone()))).collect()
        }
        OpKind::Broadcast => parts.iter().map(|_| Ok(whole(parts[first.root].data.clone()))).collect(),
        OpKind::AllGather => {
            let first_dims: Vec<usize> = descs.iter().map(|d| d.shape[0]).collect();
            let mut out_shape = shape.clone();
            out_shape[0] = first_dims.iter().sum();
            let data: Vec<u8> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
            let gathered = Gathered { data: buffer(dtype, data), first_dims, shape: out_shape };
            parts.iter().map(|_| Ok(gathered.clone())).collect()
        }
        OpKind::ReduceScatter => {
            let sum = reduced(parts, first);
            let row = shape[1..].iter().product::<usize>() * dtype.size();
            let rows = split_rows(shape[0], parts.len());
            let first_dims: Vec<usize> = rows.iter().map(ExactSizeIterator::len).collect();
            rows.iter()
                .map(|r| {
                    let mut out_shape = shape.clone();
                    out_shape[0] = r.len();
                    let data = sum[r.start * row..r.end * row].to_vec();
                    Ok(Gathered {
                        data: buffer(dtype, data),
                        first_dims: first_dims.clone(),
                        shape: out_shape,
                    })
                })
                .collect()
        }
        OpKind::Barrier | OpKind::Shutdown => parts.iter().map(|_| Ok(whole(Vec::new()))).collect(),
    }
}

/// Every rank's data, pre-scaled, combined in rank order and finished.
fn reduced(parts: &[Part], desc: &OpDesc) -> Vec<u8> {
    let opts = desc.reduce.unwrap_or_default();
    let scaled: Vec<Vec<u8>> = parts
        .iter()
        .map(|p| {
            let mut d = p.data.clone();
            scale_bytes(desc.dtype, opts.prescale, &mut d);
            d
        })
        .collect();
    let srcs: Vec<&[u8]> = scaled.iter().map(Vec::as_slice).collect();
    let mut out = vec![0u8; srcs[0].len()];
    combine_many(desc.dtype, Combine::from(opts.op), &mut out, &srcs);
    finish(desc.dtype, opts.op, parts.len(), opts.postscale, &mut out);
    out
}

fn buffer(dtype: DType, bytes: Vec<u8>) -> Buffer {
    let mut b = Buffer::zeros(dtype, bytes.len() / dtype.size());
    b.bytes_mut().copy_from_slice(&bytes);
    b
}

impl Collective for LocalWorld {
    fn rank(&self) -> usize {
        self.place.rank().get()
    }

    fn world_size(&self) -> usize {
        self.place.world().get()
    }

    fn transport(&self) -> &'static str {
        "local"
    }

    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        mut data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        let world = self.world_size();
        let desc = OpDesc::new(OpKind::AllReduce, name, data.dtype(), shape)
            .reducing(opts)
            .checked(data.len(), world);
        let out = self.round(desc, data.bytes_mut().to_vec())?;
        data.bytes_mut().copy_from_slice(out.data.bytes());
        Ok(())
    }

    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        mut data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        let world = self.world_size();
        let desc = OpDesc::new(OpKind::Broadcast, name, data.dtype(), shape)
            .from_root(root)
            .checked(data.len(), world);
        let out = self.round(desc, data.bytes_mut().to_vec())?;
        data.bytes_mut().copy_from_slice(out.data.bytes());
        Ok(())
    }

    fn all_gather(&self, name: &str, shape: &[usize], data: TensorRef<'_>) -> Result<Gathered, CommError> {
        let desc =
            OpDesc::new(OpKind::AllGather, name, data.dtype(), shape).checked(data.len(), self.world_size());
        self.round(desc, data.bytes().to_vec())
    }

    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<Gathered, CommError> {
        let desc = OpDesc::new(OpKind::ReduceScatter, name, data.dtype(), shape).reducing(opts);
        self.round(desc.checked(data.len(), self.world_size()), data.bytes().to_vec())
    }

    fn barrier(&self, name: &str) -> Result<(), CommError> {
        self.round(OpDesc::new(OpKind::Barrier, name, DType::I32, &[]), Vec::new()).map(|_| ())
    }

    fn agree(&self, desc: &OpDesc) -> Result<(), CommError> {
        self.round(desc.clone(), Vec::new()).map(|_| ())
    }
}

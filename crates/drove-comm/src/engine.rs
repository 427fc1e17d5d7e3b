//! The op implementations, over shared memory (ranks on one host), a TCP ring,
//! or both (`hierarchical.rs`: ranks on several hosts, some sharing one).

use std::ops::Range;
use std::time::{Duration, Instant};

use crate::clock::{Clock, Deadlines};
use crate::hierarchical::HostGroup;
use crate::hosts::Layout;
use crate::mesh::{Inbox, MAX_READ, Mesh};
use crate::profile::{ExchangeTimes, RingProfile};
use crate::shm::Shm;
use drove_collective::reduce::{Combine, combine_bytes, combine_many, finish, split_rows as split};
use drove_collective::{CommError, DType, OpDesc, ReduceOp, agree as check};

/// Everything one op needs to know about the reduction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reduction {
    pub dtype: DType,
    pub op: ReduceOp,
    pub postscale: f64,
}

/// The bytes an engine has moved, and the test hook that kills the process
/// after a given count.
pub(crate) struct Fault {
    moved: u64,
    kill_after: Option<u64>,
}

impl Fault {
    /// Counts bytes moved; kills this process once past the hook's count.
    pub fn count(&mut self, bytes: usize) {
        self.moved += bytes as u64;
        if let Some(limit) = self.kill_after
            && self.moved >= limit
        {
            // SAFETY: raising a signal on our own process.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

/// The ranks a ring runs over, in ring order, and this rank's place in it.
pub(crate) struct Ring {
    members: Vec<usize>,
    me: usize,
}

impl Ring {
    /// Every rank of the world.
    pub fn all(rank: usize, world: usize) -> Ring {
        Ring { members: (0..world).collect(), me: rank }
    }

    /// `members` (global ranks, `rank` among them).
    pub fn of(members: Vec<usize>, rank: usize) -> Ring {
        let me = members.iter().position(|&r| r == rank).expect("a rank is in its own ring");
        Ring { members, me }
    }

    fn len(&self) -> usize {
        self.members.len()
    }

    fn next(&self) -> usize {
        self.members[(self.me + 1) % self.len()]
    }

    fn prev(&self) -> usize {
        self.members[(self.me + self.len() - 1) % self.len()]
    }
}

/// The ring reduce-scatter's inbox: each read lands in a small buffer that
/// stays in the cache and is combined into the destination at once (a
/// partial element waits at the buffer's start for the rest), instead of
/// the whole segment going through a scratch buffer in memory first.
struct Reducing<'a> {
    dst: &'a mut [u8],
    bounce: &'a mut [u8],
    /// Bytes of a partial element at the start of `bounce`.
    pending: usize,
    /// Bytes of `dst` combined so far.
    done: usize,
    red: Reduction,
    timed: bool,
    /// Time spent combining, when `timed`.
    reduce: Duration,
}

impl<'a> Reducing<'a> {
    fn new(dst: &'a mut [u8], bounce: &'a mut [u8], red: Reduction, timed: bool) -> Self {
        Reducing { dst, bounce, pending: 0, done: 0, red, timed, reduce: Duration::ZERO }
    }
}

impl Inbox for Reducing<'_> {
    fn total(&self) -> usize {
        self.dst.len()
    }

    fn space(&mut self, _got: usize, max: usize) -> &mut [u8] {
        let room = max.min(self.bounce.len() - self.pending);
        &mut self.bounce[self.pending..self.pending + room]
    }

    fn landed(&mut self, _got: usize, n: usize) {
        let es = self.red.dtype.size();
        let have = self.pending + n;
        let whole = have / es * es;
        if whole > 0 {
            let t = self.timed.then(Instant::now);
            let dst = &mut self.dst[self.done..self.done + whole];
            combine_bytes(self.red.dtype, Combine::from(self.red.op), dst, &self.bounce[..whole]);
            self.reduce += t.map_or(Duration::ZERO, |t| t.elapsed());
            self.done += whole;
        }
        self.bounce.copy_within(whole..have, 0);
        self.pending = have - whole;
    }
}

/// Who gets the result of a staged reduction over shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deliver {
    /// Every rank of the region (an all-reduce).
    Everyone,
    /// Only the rank of this slot (a reduce, as the first step of the
    /// hierarchical all-reduce).
    Slot(usize),
}

/// The shared-memory side of an engine: a region and how many rounds it has
/// run (rounds alternate between its two buffers).
pub(crate) struct Staged<'a> {
    pub shm: &'a mut Shm,
    pub round: &'a mut usize,
    pub mesh: &'a Mesh,
    pub fault: &'a mut Fault,
}

pub(crate) struct Engine {
    pub mesh: Mesh,
    pub shm: Option<Shm>,
    /// This host's ranks in a hierarchical world.
    pub hosts: Option<HostGroup>,
    pub deadlines: Deadlines,
    pub seq: u64,
    pub broken: Option<String>,
    pub shm_round: usize,
    pub fault: Fault,
    scratch: Vec<u64>,
    /// The ring's profile, while it is taken.
    pub profile: Option<RingProfile>,
}

fn scale(r: &Range<usize>, by: usize) -> Range<usize> {
    r.start * by..r.end * by
}

/// `(&buf[a], &mut buf[b])` for disjoint ranges.
fn disjoint(buf: &mut [u8], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    assert!(a.end <= b.start || b.end <= a.start, "ranges overlap");
    if a.start < b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

/// Elements per segment piece when `world` pieces share a `chunk`-byte staging
/// buffer (a multiple of 16, so pieces stay 64-byte aligned).
fn piece_elements(chunk: usize, world: usize, es: usize) -> usize {
    (chunk / world / es / 16 * 16).max(16)
}

/// Copies piece `k` of every segment of `src` into `slot`, segment `q` at
/// offset `q * piece` elements; returns the bytes copied.
fn stage_pieces(
    slot: &mut [u8],
    src: &[u8],
    segs: &[Range<usize>],
    k: usize,
    piece: usize,
    es: usize,
) -> usize {
    let mut moved = 0;
    for (q, seg) in segs.iter().enumerate() {
        let p = scale(&piece_of(seg, k, piece), es);
        slot[q * piece * es..][..p.len()].copy_from_slice(&src[p.clone()]);
        moved += p.len();
    }
    moved
}

/// The `k`-th piece of `seg` when pieces have `piece` elements.
fn piece_of(seg: &Range<usize>, k: usize, piece: usize) -> Range<usize> {
    let start = (seg.start + k * piece).min(seg.end);
    start..(start + piece).min(seg.end)
}

impl Engine {
    pub fn new(mesh: Mesh, layout: Layout, deadlines: Deadlines, kill_after: Option<u64>) -> Self {
        let (shm, hosts) = match layout {
            Layout::Ring => (None, None),
            Layout::Shared(shm) => (Some(shm), None),
            Layout::Hierarchical(group) => (None, Some(group)),
        };
        Engine {
            mesh,
            shm,
            hosts,
            deadlines,
            seq: 0,
            broken: None,
            shm_round: 0,
            fault: Fault { moved: 0, kill_after },
            scratch: Vec::new(),
            profile: None,
        }
    }

    pub fn rank(&self) -> usize {
        self.mesh.rank
    }

    pub fn world(&self) -> usize {
        self.mesh.world
    }

    pub fn transport(&self) -> &'static str {
        match (&self.shm, &self.hosts) {
            (Some(_), _) => "shm",
            (None, Some(_)) => "hierarchical",
            (None, None) => "tcp",
        }
    }

    /// Starts profiling one ring step's exchange, if the ring is profiled.
    fn step_begins(&mut self) -> Option<Instant> {
        self.profile.as_ref()?;
        self.mesh.timing = Some(ExchangeTimes::default());
        Some(Instant::now())
    }

    /// Adds the exchange begun at `began` to step `step` of `phase`.
    fn step_ends(
        &mut self,
        phase: &'static str,
        step: usize,
        began: Option<Instant>,
        reduce: Duration,
        bytes: usize,
    ) {
        let (Some(began), Some(times)) = (began, self.mesh.timing.take()) else { return };
        if let Some(p) = self.profile.as_mut() {
            p.add(phase, step, began.elapsed(), reduce, bytes, times);
        }
    }

    /// Counts bytes moved; test hook that kills this process mid-op.
    fn moved(&mut self, bytes: usize) {
        self.fault.count(bytes);
    }

    /// Sends this rank's description to all, checks all agree. On success returns
    /// the clock of the op and every rank's description.
    pub fn begin(&mut self, mut desc: OpDesc) -> Result<(Clock, Vec<OpDesc>), CommError> {
        if let Some(cause) = &self.broken {
            return Err(CommError::Broken { cause: cause.clone() });
        }
        desc.seq = self.seq;
        self.seq += 1;
        let mut clock = Clock::new(desc.label(), &self.deadlines);
        if self.world() == 1 {
            check(std::slice::from_ref(&desc))?;
            return Ok((clock, vec![desc]));
        }
        let frames = self.mesh.all_to_all_frames(&desc.encode(), &mut clock).inspect_err(|e| self.fail(e))?;
        let mut all = Vec::with_capacity(self.world());
        for (r, body) in frames.into_iter().enumerate() {
            if r == self.rank() {
                all.push(desc.clone());
                continue;
            }
            match OpDesc::decode(&body) {
                Some(d) => all.push(d),
                None => {
                    let e = CommError::PeerLost {
                        op: clock.op.clone(),
                        ranks: vec![r],
                        detail: "sent an op description that does not decode (a different drove version?)"
                            .into(),
                    };
                    self.fail(&e);
                    return Err(e);
                }
            }
        }
        check(&all)?;
        Ok((clock, all))
    }

    /// Marks the communicator unusable after a failure in the middle of an op.
    pub fn fail(&mut self, e: &CommError) {
        if !e.is_recoverable() && self.broken.is_none() {
            self.broken = Some(e.to_string());
        }
    }

    // ---- all-reduce --------------------------------------------------------------

    /// In-place all-reduce of `buf` (elements of `red.dtype`), pre-scaled already.
    pub fn all_reduce(&mut self, buf: &mut [u8], red: Reduction, clock: &mut Clock) -> Result<(), CommError> {
        let r = if self.world() == 1 {
            finish(red.dtype, red.op, 1, red.postscale, buf);
            Ok(())
        } else if let Some(shm) = self.shm.as_mut() {
            let world = self.mesh.world;
            let mut staged =
                Staged { shm, round: &mut self.shm_round, mesh: &self.mesh, fault: &mut self.fault };
            staged.reduce(buf, red, Deliver::Everyone, Some(world), clock)
        } else if self.hosts.is_some() {
            self.hierarchical_all_reduce(buf, red, clock)
        } else {
            let ring = Ring::all(self.rank(), self.world());
            self.ring_all_reduce(&ring, buf, red, self.world(), clock)
        };
        r.inspect_err(|e| self.fail(e))
    }

    /// Ring reduce-scatter phase: after it, rank `r` holds the fully combined
    /// segment `(r + 1 + offset) % N` (not yet finished).
    fn ring_reduce_scatter_phase(
        &mut self,
        ring: &Ring,
        buf: &mut [u8],
        segs: &[Range<usize>],
        offset: usize,
        red: Reduction,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, n) = (ring.me, ring.len());
        let (next, prev) = (ring.next(), ring.prev());
        let es = red.dtype.size();
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize((MAX_READ + 16).div_ceil(8), 0);
        let bounce: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch[..]);
        let mut result = Ok(());
        for s in 0..n - 1 {
            let send_idx = (rank + offset + 2 * n - s) % n;
            let recv_idx = (rank + offset + 2 * n - s - 1) % n;
            let (send, dst) = disjoint(buf, scale(&segs[send_idx], es), scale(&segs[recv_idx], es));
            let mut sent_total = 0usize;
            let began = self.step_begins();
            let mut inbox = Reducing::new(dst, &mut *bounce, red, began.is_some());
            let r = self
                .mesh
                .exchange_into(Some((next, send)), Some((prev, &mut inbox)), clock, |sent| sent_total = sent);
            let reduce = inbox.reduce;
            self.step_ends("reduce-scatter", s, began, reduce, sent_total);
            self.moved(sent_total);
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        self.scratch = scratch;
        result
    }

    /// Ring all-gather phase: rank `r` starts holding segment `(r + 1 + offset) % N`.
    fn ring_all_gather_phase(
        &mut self,
        ring: &Ring,
        buf: &mut [u8],
        segs: &[Range<usize>],
        offset: usize,
        es: usize,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, n) = (ring.me, ring.len());
        let (next, prev) = (ring.next(), ring.prev());
        for s in 0..n - 1 {
            let send_idx = (rank + 1 + offset + 2 * n - s) % n;
            let recv_idx = (rank + offset + 2 * n - s) % n;
            let (send, dst) = disjoint(buf, scale(&segs[send_idx], es), scale(&segs[recv_idx], es));
            let mut sent_total = 0;
            let began = self.step_begins();
            let r = self.mesh.exchange(
                Some((next, send)),
                Some((prev, dst)),
                clock,
                |_, _| {},
                |s| sent_total = s,
            );
            self.step_ends("all-gather", s, began, Duration::ZERO, sent_total);
            self.moved(sent_total);
            r?;
        }
        Ok(())
    }

    /// Ring all-reduce over `ring`'s ranks; the result is finished as the
    /// reduction of `world` ranks (more than the ring's in a hierarchical world).
    pub(crate) fn ring_all_reduce(
        &mut self,
        ring: &Ring,
        buf: &mut [u8],
        red: Reduction,
        world: usize,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, n, es) = (ring.me, ring.len(), red.dtype.size());
        let segs = split(buf.len() / es, n);
        self.ring_reduce_scatter_phase(ring, buf, &segs, 0, red, clock)?;
        let mine = scale(&segs[(rank + 1) % n], es);
        finish(red.dtype, red.op, world, red.postscale, &mut buf[mine]);
        self.ring_all_gather_phase(ring, buf, &segs, 0, es, clock)
    }

    // ---- reduce-scatter ----------------------------------------------------------

    /// Reduces `input` across ranks and leaves this rank's row segment in `out`.
    /// `segs` are element ranges, one per rank.
    pub fn reduce_scatter(
        &mut self,
        input: &mut [u8],
        segs: &[Range<usize>],
        out: &mut [u8],
        red: Reduction,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, n, es) = (self.rank(), self.world(), red.dtype.size());
        let r = if n == 1 {
            out.copy_from_slice(input);
            finish(red.dtype, red.op, 1, red.postscale, out);
            Ok(())
        } else if self.shm.is_some() {
            self.shm_reduce_scatter(input, segs, out, red, clock)
        } else {
            // Offset n - 1: rank r ends holding segment r.
            let ring = Ring::all(rank, n);
            self.ring_reduce_scatter_phase(&ring, input, segs, n - 1, red, clock).map(|()| {
                let mine = scale(&segs[rank], es);
                out.copy_from_slice(&input[mine]);
                finish(red.dtype, red.op, n, red.postscale, out);
            })
        };
        r.inspect_err(|e| self.fail(e))
    }

    fn shm_reduce_scatter(
        &mut self,
        input: &[u8],
        segs: &[Range<usize>],
        out: &mut [u8],
        red: Reduction,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, world, es) = (self.rank(), self.world(), red.dtype.size());
        let shm = self.shm.as_mut().expect("shm transport");
        let piece = piece_elements(shm.chunk, world, es);
        let rounds = segs.iter().map(|s| s.len().div_ceil(piece)).max().unwrap_or(0);
        let combine = Combine::from(red.op);
        let base = segs[rank].start;
        for k in 0..rounds {
            let b = (self.shm_round + k) % 2;
            let shm = self.shm.as_mut().expect("shm transport");
            let mut moved = 0;
            moved += stage_pieces(shm.slot(rank, b), input, segs, k, piece, es);
            shm.publish();
            shm.wait_all(&self.mesh, clock)?;
            let mine = piece_of(&segs[rank], k, piece);
            if !mine.is_empty() {
                let bytes = mine.len() * es;
                let srcs: Vec<&[u8]> =
                    (0..world).map(|q| &shm.slot(q, b)[rank * piece * es..][..bytes] as &[u8]).collect();
                let dst = &mut out[(mine.start - base) * es..][..bytes];
                combine_many(red.dtype, combine, dst, &srcs);
                finish(red.dtype, red.op, world, red.postscale, dst);
            }
            self.moved(moved);
        }
        self.shm_round += rounds;
        Ok(())
    }

    // ---- all-gather --------------------------------------------------------------

    /// Gathers every rank's bytes (`counts[r]` bytes each) into `out` in rank order.
    pub fn all_gather(
        &mut self,
        input: &[u8],
        counts: &[usize],
        out: &mut [u8],
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let r = if self.world() == 1 {
            out.copy_from_slice(input);
            Ok(())
        } else if self.shm.is_some() {
            self.shm_all_gather(input, counts, out, clock)
        } else {
            let mut start = 0;
            let segs: Vec<Range<usize>> = counts
                .iter()
                .map(|&c| {
                    let r = start..start + c;
                    start += c;
                    r
                })
                .collect();
            out[segs[self.rank()].clone()].copy_from_slice(input);
            let n = self.world();
            let ring = Ring::all(self.rank(), n);
            // Offset n - 1: rank r starts holding segment r.
            self.ring_all_gather_phase(&ring, out, &segs, n - 1, 1, clock)
        };
        r.inspect_err(|e| self.fail(e))
    }

    fn shm_all_gather(
        &mut self,
        input: &[u8],
        counts: &[usize],
        out: &mut [u8],
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, world) = (self.rank(), self.world());
        let chunk = self.shm.as_ref().expect("shm transport").chunk;
        let offsets: Vec<usize> = counts
            .iter()
            .scan(0, |acc, &c| {
                let o = *acc;
                *acc += c;
                Some(o)
            })
            .collect();
        let rounds = counts.iter().map(|c| c.div_ceil(chunk)).max().unwrap_or(0);
        for k in 0..rounds {
            let b = (self.shm_round + k) % 2;
            let shm = self.shm.as_mut().expect("shm transport");
            let mine = (k * chunk).min(input.len())..((k + 1) * chunk).min(input.len());
            shm.slot(rank, b)[..mine.len()].copy_from_slice(&input[mine.clone()]);
            shm.publish();
            shm.wait_all(&self.mesh, clock)?;
            for q in 0..world {
                let part = (k * chunk).min(counts[q])..((k + 1) * chunk).min(counts[q]);
                out[offsets[q] + part.start..offsets[q] + part.end]
                    .copy_from_slice(&shm.slot(q, b)[..part.len()]);
            }
            self.moved(mine.len());
        }
        self.shm_round += rounds;
        Ok(())
    }

    // ---- broadcast ---------------------------------------------------------------

    pub fn broadcast(&mut self, buf: &mut [u8], root: usize, clock: &mut Clock) -> Result<(), CommError> {
        let r = if self.world() == 1 {
            Ok(())
        } else if let Some(shm) = self.shm.as_mut() {
            let mut staged =
                Staged { shm, round: &mut self.shm_round, mesh: &self.mesh, fault: &mut self.fault };
            staged.broadcast(buf, root, clock)
        } else {
            self.chain_broadcast(buf, root, clock)
        };
        r.inspect_err(|e| self.fail(e))
    }

    /// Pipelined chain root -> root+1 -> ... in 1 MiB chunks.
    fn chain_broadcast(&mut self, buf: &mut [u8], root: usize, clock: &mut Clock) -> Result<(), CommError> {
        const CHUNK: usize = 1 << 20;
        let (rank, n) = (self.rank(), self.world());
        let pos = (rank + n - root) % n;
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let chunks = buf.len().div_ceil(CHUNK).max(1);
        let len = buf.len();
        let range = |i: usize| (i * CHUNK).min(len)..((i + 1) * CHUNK).min(len);
        // Step i receives chunk i and forwards chunk i - 1.
        for i in 0..=chunks {
            let send = (pos + 1 < n && i >= 1).then(|| range(i - 1));
            let recv = (pos > 0 && i < chunks).then(|| range(i));
            let mut sent_total = 0;
            let r = match (send, recv) {
                (Some(s), Some(r)) => {
                    let (s, r) = disjoint(buf, s, r);
                    self.mesh.exchange(Some((next, s)), Some((prev, r)), clock, |_, _| {}, |x| sent_total = x)
                }
                (Some(s), None) => {
                    self.mesh.exchange(Some((next, &buf[s])), None, clock, |_, _| {}, |x| sent_total = x)
                }
                (None, Some(r)) => {
                    self.mesh.exchange(None, Some((prev, &mut buf[r])), clock, |_, _| {}, |_| {})
                }
                (None, None) => Ok(()),
            };
            self.moved(sent_total);
            r?;
        }
        Ok(())
    }
}

impl Staged<'_> {
    /// Reduces `buf` (elements of `red.dtype`) across the region's ranks: in
    /// rounds, every rank stages a piece of each segment, the owner of a
    /// segment combines its pieces from every slot, and whoever `deliver`
    /// names copies the combined pieces back. With `finish: Some(n)` the
    /// result is finished as the reduction of `n` ranks (averaged,
    /// post-scaled); with `None` it is left as the plain combination.
    pub fn reduce(
        &mut self,
        buf: &mut [u8],
        red: Reduction,
        deliver: Deliver,
        finish_as: Option<usize>,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, world, es) = (self.shm.rank, self.shm.world, red.dtype.size());
        let n = buf.len() / es;
        let segs = split(n, world);
        let piece = piece_elements(self.shm.chunk, world, es);
        let rounds = segs.iter().map(|s| s.len().div_ceil(piece)).max().unwrap_or(0);
        let combine = Combine::from(red.op);
        let receives = deliver == Deliver::Everyone || deliver == Deliver::Slot(rank);
        for k in 0..rounds {
            let b = (*self.round + k) % 2;
            let shm = &mut *self.shm;
            let moved = stage_pieces(shm.slot(rank, b), buf, &segs, k, piece, es);
            shm.publish();
            shm.wait_all(self.mesh, clock)?;
            let mine = scale(&piece_of(&segs[rank], k, piece), es);
            if !mine.is_empty() {
                let srcs: Vec<&[u8]> =
                    (0..world).map(|q| &shm.slot(q, b)[rank * piece * es..][..mine.len()] as &[u8]).collect();
                let out = &mut buf[mine.clone()];
                combine_many(red.dtype, combine, out, &srcs);
                if let Some(n) = finish_as {
                    finish(red.dtype, red.op, n, red.postscale, out);
                }
                shm.slot(rank, b)[rank * piece * es..][..mine.len()].copy_from_slice(out);
            }
            shm.publish();
            shm.wait_all(self.mesh, clock)?;
            if receives {
                for (q, seg) in segs.iter().enumerate() {
                    if q != rank {
                        let p = scale(&piece_of(seg, k, piece), es);
                        buf[p.clone()].copy_from_slice(&shm.slot(q, b)[q * piece * es..][..p.len()]);
                    }
                }
            }
            self.fault.count(moved);
        }
        *self.round += rounds;
        Ok(())
    }

    /// Copies `buf` of slot `root` to every rank of the region.
    pub fn broadcast(&mut self, buf: &mut [u8], root: usize, clock: &mut Clock) -> Result<(), CommError> {
        let rank = self.shm.rank;
        let chunk = self.shm.chunk;
        let rounds = buf.len().div_ceil(chunk);
        for k in 0..rounds {
            let b = (*self.round + k) % 2;
            let part = k * chunk..((k + 1) * chunk).min(buf.len());
            let shm = &mut *self.shm;
            if rank == root {
                shm.slot(root, b)[..part.len()].copy_from_slice(&buf[part.clone()]);
            }
            shm.publish();
            shm.wait_all(self.mesh, clock)?;
            if rank != root {
                buf[part.clone()].copy_from_slice(&shm.slot(root, b)[..part.len()]);
            }
            self.fault.count(part.len());
        }
        *self.round += rounds;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_even_and_covers() {
        assert_eq!(split(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(split(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
        assert_eq!(split(0, 2), vec![0..0, 0..0]);
    }

    #[test]
    fn reads_that_split_elements_are_combined_whole() {
        let mine: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let theirs: Vec<f32> = (0..100).map(|i| 1000.0 + i as f32).collect();
        let mut dst = mine.clone();
        let mut bounce = vec![0u64; 4];
        let red = Reduction { dtype: DType::F32, op: ReduceOp::Sum, postscale: 1.0 };
        let wire: &[u8] = bytemuck::cast_slice(&theirs);
        let mut inbox = Reducing::new(
            bytemuck::cast_slice_mut(&mut dst),
            bytemuck::cast_slice_mut(&mut bounce),
            red,
            false,
        );
        let mut got = 0;
        while got < wire.len() {
            let space = inbox.space(got, 7);
            let n = space.len().min(wire.len() - got);
            space[..n].copy_from_slice(&wire[got..got + n]);
            inbox.landed(got, n);
            got += n;
        }
        assert_eq!(inbox.done, wire.len());
        let want: Vec<f32> = mine.iter().zip(&theirs).map(|(a, b)| a + b).collect();
        assert_eq!(dst, want);
    }

    #[test]
    fn pieces_cover_a_segment() {
        let seg = 5..23;
        let pieces: Vec<_> = (0..4).map(|k| piece_of(&seg, k, 5)).collect();
        assert_eq!(pieces, vec![5..10, 10..15, 15..20, 20..23]);
        assert!(piece_of(&seg, 4, 5).is_empty());
    }
}

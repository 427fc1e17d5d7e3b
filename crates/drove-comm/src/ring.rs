//! The TCP ring over any ordered subset of ranks: reduce-scatter and
//! all-gather phases whose sends, receives and reductions overlap (each read
//! combined as it lands, in a buffer that stays in the cache), the ring
//! all-reduce, and the pipelined chain broadcast.

use std::time::{Duration, Instant};

use drove_collective::CommError;
use drove_collective::transport::reduce::{Combine, combine_bytes, finish, split_rows as split};
use std::ops::Range;

use crate::clock::Clock;
use crate::mesh::{Inbox, MAX_READ, Mesh};
use crate::profile::{ExchangeTimes, RingProfile};
use crate::reduction::{Fault, Reduction, disjoint, scale};

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

/// The parts of an engine a ring runs on: the mesh, a scratch buffer, the
/// profile (while it is taken) and the bytes moved.
pub(crate) struct RingRun<'a> {
    pub mesh: &'a mut Mesh,
    pub scratch: &'a mut Vec<u64>,
    pub profile: &'a mut Option<RingProfile>,
    pub fault: &'a mut Fault,
}

impl RingRun<'_> {
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

    /// Ring reduce-scatter phase: after it, rank `r` holds the fully combined
    /// segment `(r + 1 + offset) % N` (not yet finished).
    pub fn reduce_scatter_phase(
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
        let mut scratch = std::mem::take(self.scratch);
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
        *self.scratch = scratch;
        result
    }

    /// Ring all-gather phase: rank `r` starts holding segment `(r + 1 + offset) % N`.
    pub fn all_gather_phase(
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
    pub fn all_reduce(
        &mut self,
        ring: &Ring,
        buf: &mut [u8],
        red: Reduction,
        world: usize,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let (rank, n, es) = (ring.me, ring.len(), red.dtype.size());
        let segs = split(buf.len() / es, n);
        self.reduce_scatter_phase(ring, buf, &segs, 0, red, clock)?;
        let mine = scale(&segs[(rank + 1) % n], es);
        finish(red.dtype, red.op, world, red.postscale, &mut buf[mine]);
        self.all_gather_phase(ring, buf, &segs, 0, es, clock)
    }

    /// Pipelined chain root -> root+1 -> ... in 1 MiB chunks.
    pub fn chain_broadcast(
        &mut self,
        buf: &mut [u8],
        root: usize,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        const CHUNK: usize = 1 << 20;
        let (rank, n) = (self.mesh.rank, self.mesh.world);
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

#[cfg(test)]
mod tests {
    use drove_collective::{DType, ReduceOp};

    use super::*;
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
}

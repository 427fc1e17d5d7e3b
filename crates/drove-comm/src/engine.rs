//! The op implementations, over shared memory (ranks on one host), a TCP ring,
//! or both (`hierarchical.rs`: ranks on several hosts, some sharing one).

use std::ops::Range;

use drove_collective::transport::agree as check;
use drove_collective::transport::reduce::{Combine, combine_many, finish};
use drove_collective::{CommError, OpDesc};

use crate::clock::{Clock, Deadlines};
use crate::hierarchical::{self, HostGroup};
use crate::hosts::Topology;
use crate::mesh::Mesh;
use crate::profile::RingProfile;
use crate::reduction::{Fault, Reduction, scale};
use crate::ring::{Ring, RingRun};
use crate::shm::Shm;
use crate::staged::{Deliver, Staged, piece_elements, piece_of, stage_pieces};

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

impl Engine {
    /// The parts the TCP ring runs on.
    fn ring(&mut self) -> RingRun<'_> {
        RingRun {
            mesh: &mut self.mesh,
            scratch: &mut self.scratch,
            profile: &mut self.profile,
            fault: &mut self.fault,
        }
    }

    pub fn new(mesh: Mesh, topology: Topology, deadlines: Deadlines, kill_after: Option<u64>) -> Self {
        let (shm, hosts) = match topology {
            Topology::Ring => (None, None),
            Topology::Shared(shm) => (Some(shm), None),
            Topology::Hierarchical(group) => (None, Some(group)),
        };
        Engine {
            mesh,
            shm,
            hosts,
            deadlines,
            seq: 0,
            broken: None,
            shm_round: 0,
            fault: Fault::new(kill_after),
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
        } else if let Some(group) = self.hosts.as_mut() {
            let mut run = RingRun {
                mesh: &mut self.mesh,
                scratch: &mut self.scratch,
                profile: &mut self.profile,
                fault: &mut self.fault,
            };
            hierarchical::all_reduce(group, &mut self.shm_round, &mut run, buf, red, clock)
        } else {
            let (ring, world) = (Ring::all(self.rank(), self.world()), self.world());
            self.ring().all_reduce(&ring, buf, red, world, clock)
        };
        r.inspect_err(|e| self.fail(e))
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
            self.ring().reduce_scatter_phase(&ring, input, segs, n - 1, red, clock).map(|()| {
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
            self.ring().all_gather_phase(&ring, out, &segs, n - 1, 1, clock)
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
            self.ring().chain_broadcast(buf, root, clock)
        };
        r.inspect_err(|e| self.fail(e))
    }
}

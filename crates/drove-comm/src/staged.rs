//! Collectives over one host's shared-memory region: a staged reduction
//! (every rank stages a piece of each segment, the segment's owner combines
//! them, whoever is told copies the result back) and the broadcast.

use std::ops::Range;

use drove_collective::CommError;
use drove_collective::transport::reduce::{Combine, combine_many, finish, split_rows as split};

use crate::clock::Clock;
use crate::mesh::Mesh;
use crate::reduction::{Fault, Reduction, scale};
use crate::shm::Shm;

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

/// Elements per segment piece when `world` pieces share a `chunk`-byte staging
/// buffer (a multiple of 16, so pieces stay 64-byte aligned).
pub(crate) fn piece_elements(chunk: usize, world: usize, es: usize) -> usize {
    (chunk / world / es / 16 * 16).max(16)
}

/// Copies piece `k` of every segment of `src` into `slot`, segment `q` at
/// offset `q * piece` elements; returns the bytes copied.
pub(crate) fn stage_pieces(
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
pub(crate) fn piece_of(seg: &Range<usize>, k: usize, piece: usize) -> Range<usize> {
    let start = (seg.start + k * piece).min(seg.end);
    start..(start + piece).min(seg.end)
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
    fn pieces_cover_a_segment() {
        let seg = 5..23;
        let pieces: Vec<_> = (0..4).map(|k| piece_of(&seg, k, 5)).collect();
        assert_eq!(pieces, vec![5..10, 10..15, 15..20, 20..23]);
        assert!(piece_of(&seg, 4, 5).is_empty());
    }
}

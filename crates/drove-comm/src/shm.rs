//! A shared-memory region for ranks on one host: per rank a progress counter and
//! two staging buffers (double buffering). Ranks stage chunks, publish their
//! progress, and read each other's chunks once everyone has published: data moves
//! through the caches instead of through the kernel's socket buffers.
//!
//! Waiting spins briefly, then yields, then sleeps on a futex; every millisecond
//! it checks the deadline, the TCP mesh for dead peers and the region's abort
//! record, so nothing waits without a deadline. A region may serve a whole
//! world (every rank on one host) or one host's ranks of a hierarchical world;
//! its slots are named by the global ranks that own them, so errors name ranks
//! as the rest of the world knows them. There the host's leader, failing in
//! the ring between hosts, writes its error to the abort record, and the ranks
//! waiting for it on this host fail with the same ranks named.

use std::fs::OpenOptions;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use crate::clock::Clock;
use crate::mesh::Mesh;
use drove_collective::CommError;

const LINE: usize = 64;
/// Counters (one line per rank, then the sleepers' line) in the first half,
/// the abort record in the second.
const HEADER: usize = 8192;
const ABORT: usize = HEADER / 2;
/// Room for the abort record's ranks and message.
const ABORT_ROOM: usize = HEADER - ABORT - 12;

/// The most ranks one region serves.
pub(crate) const MAX_RANKS: usize = ABORT / LINE - 1;

/// The mapped region.
pub(crate) struct Shm {
    map: MmapMut,
    /// This rank's slot.
    pub rank: usize,
    /// How many ranks share the region.
    pub world: usize,
    /// The global rank owning each slot (errors name these).
    ranks: Vec<usize>,
    /// Bytes of one staging buffer.
    pub chunk: usize,
    /// This rank's published phase.
    phase: u32,
}

// SAFETY: the region is shared between processes by design; every access to
// shared bytes is ordered by the counters' acquire/release protocol.
unsafe impl Send for Shm {}

impl Shm {
    /// Size of the region for `world` ranks with `chunk`-byte buffers.
    pub fn size(world: usize, chunk: usize) -> usize {
        HEADER + world * 2 * chunk
    }

    /// Creates (the first of `ranks`) or opens (the others) the region at
    /// `path` for slot `rank`; slot `i` belongs to global rank `ranks[i]`.
    pub fn open(
        path: &str,
        create: bool,
        rank: usize,
        ranks: Vec<usize>,
        chunk: usize,
    ) -> std::io::Result<Shm> {
        let world = ranks.len();
        assert!(world <= MAX_RANKS, "too many ranks for the shared-memory header");
        assert!(chunk.is_multiple_of(LINE));
        let file = OpenOptions::new().read(true).write(true).create_new(create).open(path)?;
        if create {
            file.set_len(Self::size(world, chunk) as u64)?;
        } else if file.metadata()?.len() != Self::size(world, chunk) as u64 {
            return Err(std::io::Error::other(format!("{path} has the wrong size")));
        }
        // SAFETY: the file is ours (created with a unique name and unlinked once
        // every rank mapped it); concurrent access follows the counter protocol.
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ok(Shm { map, rank, world, ranks, chunk, phase: 0 })
    }

    fn counter(&self, r: usize) -> &AtomicU32 {
        // SAFETY: in bounds (checked in `open`), 64-byte aligned in a page-aligned map,
        // and AtomicU32 has the layout of u32.
        unsafe { &*(self.map.as_ptr().add(r * LINE) as *const AtomicU32) }
    }

    fn sleepers(&self) -> &AtomicU32 {
        // SAFETY: as in `counter`, the line after the counters.
        unsafe { &*(self.map.as_ptr().add(self.world * LINE) as *const AtomicU32) }
    }

    /// The staging buffer `buf` (0 or 1) of rank `r`.
    #[allow(clippy::mut_from_ref)]
    pub fn slot(&self, r: usize, buf: usize) -> &mut [u8] {
        let off = HEADER + (r * 2 + buf) * self.chunk;
        // SAFETY: in bounds. Aliasing across ranks is ruled out by the protocol: a rank
        // writes only its own slot, and only after every reader of that buffer has
        // published that it is done with it.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_ptr().add(off) as *mut u8, self.chunk) }
    }

    /// Publishes the next phase of this rank.
    pub fn publish(&mut self) -> u32 {
        self.phase = self.phase.wrapping_add(1);
        let c = self.counter(self.rank);
        c.store(self.phase, Ordering::Release);
        if self.sleepers().load(Ordering::SeqCst) > 0 {
            futex_wake(c);
        }
        self.phase
    }

    fn abort_flag(&self) -> &AtomicU32 {
        // SAFETY: in bounds and aligned (HEADER/2 in a page-aligned map).
        unsafe { &*(self.map.as_ptr().add(ABORT) as *const AtomicU32) }
    }

    /// Records `error` for the ranks waiting on this region (the first
    /// record wins) and wakes them.
    pub fn abort(&self, error: &CommError) {
        let named = match error {
            CommError::PeerLost { ranks, .. } | CommError::Timeout { ranks, .. } => ranks.clone(),
            CommError::Stalled { ranks, hung_up, .. } => ranks.iter().chain(hung_up).copied().collect(),
            _ => Vec::new(),
        };
        let mut record: Vec<u8> = Vec::new();
        record.extend_from_slice(&(named.len() as u32).to_le_bytes());
        named.iter().for_each(|&r| record.extend_from_slice(&(r as u32).to_le_bytes()));
        record.extend_from_slice(error.to_string().as_bytes());
        record.truncate(ABORT_ROOM);
        let flag = self.abort_flag();
        if flag.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return;
        }
        // SAFETY: in bounds; only the rank that set the flag to 1 writes here,
        // and readers read only after it is 2 (release below).
        unsafe {
            let at = self.map.as_ptr().add(ABORT + 4) as *mut u8;
            std::ptr::copy_nonoverlapping((record.len() as u32).to_le_bytes().as_ptr(), at, 4);
            std::ptr::copy_nonoverlapping(record.as_ptr(), at.add(4), record.len());
        }
        flag.store(2, Ordering::Release);
        for r in 0..self.world {
            futex_wake(self.counter(r));
        }
    }

    /// The error another rank recorded with [`Shm::abort`], as this rank's
    /// error in `op`.
    fn aborted(&self, op: &str) -> Option<CommError> {
        if self.abort_flag().load(Ordering::Acquire) != 2 {
            return None;
        }
        // SAFETY: in bounds; written once before the flag became 2.
        let bytes =
            unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(ABORT + 4), HEADER - ABORT - 4) };
        let len = (u32::from_le_bytes(bytes[..4].try_into().ok()?) as usize).min(ABORT_ROOM);
        let record = &bytes[4..4 + len];
        let count = u32::from_le_bytes(record.get(..4)?.try_into().ok()?) as usize;
        let ranks: Vec<usize> = record
            .get(4..4 + 4 * count)?
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as usize)
            .collect();
        let message = String::from_utf8_lossy(&record[4 + 4 * count..]);
        Some(CommError::PeerLost {
            op: op.to_string(),
            ranks,
            detail: format!("this host's leader failed between hosts ({message})"),
        })
    }

    fn reached(&self, r: usize, phase: u32) -> bool {
        let v = self.counter(r).load(Ordering::Acquire);
        (v.wrapping_sub(phase) as i32) >= 0
    }

    /// Waits until ranks `who` have all published `phase` (this rank's current
    /// phase if `None`).
    pub fn wait(
        &self,
        who: impl Iterator<Item = usize> + Clone,
        mesh: &Mesh,
        clock: &mut Clock,
    ) -> Result<(), CommError> {
        let phase = self.phase;
        let mut spins = 0u32;
        let mut last_check = Instant::now();
        for r in who.clone() {
            if r == self.rank {
                continue;
            }
            while !self.reached(r, phase) {
                spins += 1;
                if spins < 200 {
                    std::hint::spin_loop();
                } else if spins < 2000 {
                    std::thread::yield_now();
                } else {
                    let c = self.counter(r);
                    self.sleepers().fetch_add(1, Ordering::SeqCst);
                    let seen = c.load(Ordering::SeqCst);
                    if !self.reached(r, phase) {
                        futex_wait(c, seen, Duration::from_millis(1));
                    }
                    self.sleepers().fetch_sub(1, Ordering::SeqCst);
                }
                if spins.is_multiple_of(256) || last_check.elapsed() >= Duration::from_millis(1) {
                    last_check = Instant::now();
                    if let Some(e) = self.aborted(&clock.op) {
                        return Err(e);
                    }
                    let missing: Vec<usize> = who
                        .clone()
                        .filter(|&q| q != self.rank && !self.reached(q, phase))
                        .map(|q| self.ranks[q])
                        .collect();
                    mesh.check_alive(clock, &missing)?;
                    mesh.check_deadline(clock, &missing)?;
                }
            }
        }
        Ok(())
    }

    /// Waits for every rank.
    pub fn wait_all(&self, mesh: &Mesh, clock: &mut Clock) -> Result<(), CommError> {
        self.wait(0..self.world, mesh, clock)
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a shared (non-private) futex wait on a valid, aligned u32 with a timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: wakes waiters on a valid, aligned u32.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abort_recorded_by_one_rank_is_read_by_the_others_with_its_ranks() {
        let path = format!("/dev/shm/drove-test-abort-{}", std::process::id());
        let leader = Shm::open(&path, true, 0, vec![4, 5], 4096).expect("creating a region");
        let member = Shm::open(&path, false, 1, vec![4, 5], 4096).expect("opening it");
        let _ = std::fs::remove_file(&path);
        assert!(member.aborted("op").is_none());
        let cause =
            CommError::PeerLost { op: "all_reduce \"g\"".into(), ranks: vec![2, 3], detail: "cut".into() };
        leader.abort(&cause);
        leader.abort(&CommError::Broken { cause: "a later failure".into() });
        match member.aborted("all_reduce \"g\"") {
            Some(CommError::PeerLost { op, ranks, detail }) => {
                assert_eq!(op, "all_reduce \"g\"");
                assert_eq!(ranks, vec![2, 3]);
                assert!(detail.contains("lost rank(s) [2, 3]: cut"), "{detail}");
            }
            other => panic!("expected the leader's loss, got {other:?}"),
        }
    }
}

//! A shared-memory region for ranks on one host: per rank a progress counter and
//! two staging buffers (double buffering). Ranks stage chunks, publish their
//! progress, and read each other's chunks once everyone has published: data moves
//! through the caches instead of through the kernel's socket buffers.
//!
//! Waiting spins briefly, then yields, then sleeps on a futex; every millisecond
//! it checks the deadline and the TCP mesh for dead peers, so nothing waits
//! without a deadline.

use std::fs::OpenOptions;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use crate::error::CommError;
use crate::mesh::{Clock, Mesh};

const LINE: usize = 64;
const HEADER: usize = 4096;

/// The mapped region.
pub(crate) struct Shm {
    map: MmapMut,
    pub rank: usize,
    pub world: usize,
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

    /// Creates (rank 0) or opens (others) the region at `path`.
    pub fn open(path: &str, create: bool, rank: usize, world: usize, chunk: usize) -> std::io::Result<Shm> {
        assert!(world * LINE + LINE <= HEADER, "too many ranks for the shared-memory header");
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
        Ok(Shm { map, rank, world, chunk, phase: 0 })
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
                    let missing: Vec<usize> =
                        who.clone().filter(|&q| q != self.rank && !self.reached(q, phase)).collect();
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

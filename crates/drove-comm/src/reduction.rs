//! What an op reduces with, the bytes an engine has moved (and the test hook
//! on them), and the byte ranges of elements the algorithms work on.

use std::ops::Range;

use drove_collective::{DType, ReduceOp};

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
    /// Nothing moved yet; the process kills itself past `kill_after` bytes.
    pub fn new(kill_after: Option<u64>) -> Fault {
        Fault { moved: 0, kill_after }
    }

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

/// Element range `r` as the byte range of elements of `by` bytes.
pub(crate) fn scale(r: &Range<usize>, by: usize) -> Range<usize> {
    r.start * by..r.end * by
}

/// `(&buf[a], &mut buf[b])` for disjoint ranges.
pub(crate) fn disjoint(buf: &mut [u8], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    assert!(a.end <= b.start || b.end <= a.start, "ranges overlap");
    if a.start < b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}

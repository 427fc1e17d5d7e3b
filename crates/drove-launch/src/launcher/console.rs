//! Where the ranks' output goes: the launcher relays every line whole,
//! prefixed `[R] `, and hands rank 0's progress lines to whoever draws them.

use std::io::Write as _;

use crate::progress::Progress;

/// Which of a rank's streams a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// The launcher's terminal: a binary implements it to draw a progress bar.
pub trait Console: Send + Sync {
    /// Writes one line of `rank` (`line` ends with its newline unless it was
    /// the stream's last, unterminated one). An error means the destination
    /// is closed: the launcher then drains the rank's output without writing.
    fn line(&self, rank: usize, stream: Stream, line: &[u8]) -> std::io::Result<()>;

    /// Whether this console draws progress: if so the launcher asks the ranks
    /// for progress lines (`DROVE_PROGRESS=launcher`) and hands them to
    /// [`progress`](Self::progress) instead of [`line`](Self::line).
    fn draws_progress(&self) -> bool {
        false
    }

    /// Rank 0's progress.
    fn progress(&self, _progress: &Progress) {}

    /// A line of the launcher's own (where its coordinator serves metrics),
    /// unprefixed; by default to this process's stderr.
    fn note(&self, text: &str) {
        let _ = writeln!(std::io::stderr().lock(), "{text}");
    }
}

/// Lines to this process's stdout and stderr, prefixed `[R] `, each written
/// whole under the stream's lock.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlainConsole;

impl Console for PlainConsole {
    fn line(&self, rank: usize, stream: Stream, line: &[u8]) -> std::io::Result<()> {
        let out = prefixed(rank, line);
        match stream {
            Stream::Stderr => std::io::stderr().lock().write_all(&out),
            Stream::Stdout => {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&out).and_then(|()| stdout.flush())
            }
        }
    }
}

/// `[R] line`, ending with a newline.
pub fn prefixed(rank: usize, line: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(line.len() + 8);
    out.extend_from_slice(format!("[{rank}] ").as_bytes());
    out.extend_from_slice(line);
    if !line.ends_with(b"\n") {
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_line_ends_prefixed_and_terminated() {
        assert_eq!(super::prefixed(3, b"hello\n"), b"[3] hello\n");
        assert_eq!(super::prefixed(0, b"last"), b"[0] last\n");
    }
}

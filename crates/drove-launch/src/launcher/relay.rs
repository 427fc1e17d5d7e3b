//! One thread per rank stream, copying its lines to the [`Console`].

use std::io::{BufRead as _, BufReader, Read};
use std::sync::{Arc, mpsc};

use crate::launcher::console::{Console, Stream};
use crate::progress::Progress;

/// Stack of the relay and wait threads (three per rank; they hold little).
pub(crate) const THREAD_STACK: usize = 256 << 10;

/// Copies `source` line by line to `console`; with a console that draws
/// progress, rank 0's progress lines go to it as [`Progress`]. Keeps draining
/// when the console's destination is closed, so a rank never blocks on a full
/// pipe. Sends on `done` at the stream's end.
pub(crate) fn relay(
    rank: usize,
    stream: Stream,
    source: impl Read + Send + 'static,
    console: Arc<dyn Console>,
    done: mpsc::Sender<()>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("relay-{rank}")).stack_size(THREAD_STACK).spawn(move || {
        let mut reader = BufReader::with_capacity(64 << 10, source);
        let mut line = Vec::new();
        let mut open = true;
        let progress = console.draws_progress();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            if !open {
                continue;
            }
            if progress && let Some(p) = Progress::parse_line(&line) {
                console.progress(&p);
                continue;
            }
            open = console.line(rank, stream, &line).is_ok();
        }
        let _ = done.send(());
    })
}

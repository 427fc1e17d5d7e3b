//! The launcher's side: the Python watcher's files on the ranks'
//! `PYTHONPATH`, the socket their notes arrive at, and a thread comparing
//! them as they come.

use std::ffi::OsString;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::compare::{Completed, NoteComparer};
use crate::error::WatchError;
use crate::finding::{Finding, Fix};
use crate::masks::MaskComparison;
use crate::note::Note;

/// `drove_watch.py`: the watcher every watched Python rank imports.
pub const PYTHON_WATCHER: &str = include_str!("../python/drove_watch.py");
/// The `sitecustomize.py` that imports it, then the program's own.
pub const PYTHON_SITECUSTOMIZE: &str = include_str!("../python/sitecustomize.py");
/// The variable naming the socket the notes go to.
pub const SOCKET_VAR: &str = "DROVE_WATCH_SOCKET";
/// The variable giving the batches between two mask notes.
pub const EVERY_VAR: &str = "DROVE_WATCH_EVERY";

/// Where the watcher's findings go (a launcher: its console and the coordinator).
pub trait WatchSink: Send {
    /// An alarm, with its fix.
    fn alarm(&mut self, finding: &Finding, fix: Fix);
    /// Every comparison of the ranks' masks of one batch.
    fn compared(&mut self, comparison: &MaskComparison);
}

/// How to watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    /// Ranks in the world.
    pub world_size: usize,
    /// Batches between two mask notes of a loader.
    pub every: u32,
}

/// What a watch saw, at its end.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WatchSummary {
    /// Notes read.
    pub notes: u64,
    /// Datagrams that were not notes (each dropped).
    pub unreadable: u64,
    /// Mask comparisons made.
    pub comparisons: u64,
    /// Their mean agreements, summed.
    pub agreement_sum: f64,
    /// Their independent masks' agreements, summed.
    pub expected_sum: f64,
    /// Comparisons whose verdict was an alarm.
    pub beyond_band: u64,
    /// Alarms raised.
    pub alarms: u64,
    /// Every stream alarm raised, in full.
    pub alarmed: Vec<Finding>,
    /// Streams shared but never drawn from.
    pub warnings: Vec<Finding>,
}

impl WatchSummary {
    /// Counts what one note completed.
    pub fn count(&mut self, done: &Completed) {
        self.notes += 1;
        if let Some(c) = &done.compared {
            self.comparisons += 1;
            self.agreement_sum += c.report.mean_agreement;
            self.expected_sum += c.report.expected;
            self.beyond_band += u64::from(c.report.is_alarm());
        }
        self.alarms += done.alarms.len() as u64;
    }

    /// The end of a watch: every stream alarm in full, and the warnings.
    pub fn close(&mut self, comparer: &NoteComparer) {
        self.alarmed = comparer.alarms();
        self.warnings = comparer.warnings();
    }

    /// One line of what was seen: the masks' mean agreement against
    /// independent masks', or that no batch carried an MLM mask.
    pub fn describe(&self) -> String {
        if self.comparisons == 0 {
            return format!("{} notes, no batch with an MLM mask compared", self.notes);
        }
        let n = self.comparisons as f64;
        format!(
            "{} notes; the masks of {} batches compared: mean agreement {:.4} against {:.4} for independent \
             masks, {} beyond the 3-sigma band",
            self.notes,
            self.comparisons,
            self.agreement_sum / n,
            self.expected_sum / n,
            self.beyond_band
        )
    }
}

/// A running watch: the files, the socket and the comparing thread.
pub struct Watcher {
    dir: tempfile::TempDir,
    socket: PathBuf,
    every: u32,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<WatchSummary>>,
}

impl Watcher {
    /// Writes the watcher's files, binds the socket and starts comparing.
    pub fn start(options: WatchOptions, mut sink: Box<dyn WatchSink>) -> Result<Watcher, WatchError> {
        let io = |what: &str| {
            let what = what.to_string();
            move |source| WatchError::Io { what, source }
        };
        let dir = tempfile::Builder::new()
            .prefix("drove-watch-")
            .tempdir()
            .map_err(io("making the watcher's folder"))?;
        std::fs::write(dir.path().join("drove_watch.py"), PYTHON_WATCHER)
            .map_err(io("writing drove_watch.py"))?;
        std::fs::write(dir.path().join("sitecustomize.py"), PYTHON_SITECUSTOMIZE)
            .map_err(io("writing sitecustomize.py"))?;
        let socket = dir.path().join("notes.sock");
        let receiver = UnixDatagram::bind(&socket).map_err(io("binding the watcher's socket"))?;
        receiver
            .set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(io("setting the socket's timeout"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("drove-watch".into())
            .spawn(move || receive(&receiver, options.world_size, sink.as_mut(), &stopping))
            .map_err(io("starting the watcher's thread"))?;
        Ok(Watcher { dir, socket, every: options.every.max(1), stop, thread: Some(thread) })
    }

    /// The variables every watched rank gets: the watcher's folder first on
    /// `PYTHONPATH` (before `inherited`, the one the rank would have had),
    /// the socket and the mask cadence.
    pub fn env(&self, inherited: Option<OsString>) -> Vec<(String, String)> {
        let mut path = self.dir.path().to_string_lossy().into_owned();
        if let Some(rest) = inherited.filter(|p| !p.is_empty()) {
            path.push(':');
            path.push_str(&rest.to_string_lossy());
        }
        vec![
            ("PYTHONPATH".to_string(), path),
            (SOCKET_VAR.to_string(), self.socket.to_string_lossy().into_owned()),
            (EVERY_VAR.to_string(), self.every.to_string()),
        ]
    }

    /// Stops watching once the notes already sent are read; what was seen.
    pub fn finish(mut self) -> WatchSummary {
        self.stop.store(true, Ordering::Release);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads notes until told to stop and the socket is empty.
fn receive(
    socket: &UnixDatagram,
    world_size: usize,
    sink: &mut dyn WatchSink,
    stop: &AtomicBool,
) -> WatchSummary {
    let mut comparer = NoteComparer::new(world_size);
    let mut summary = WatchSummary::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let stopping = stop.load(Ordering::Acquire);
        match socket.recv(&mut buf) {
            Ok(n) => match Note::parse(&buf[..n]) {
                Ok(note) => {
                    let done = comparer.add(note);
                    summary.count(&done);
                    if let Some(c) = &done.compared {
                        sink.compared(c);
                    }
                    for (finding, fix) in &done.alarms {
                        sink.alarm(finding, *fix);
                    }
                }
                Err(e) => {
                    summary.unreadable += 1;
                    tracing::debug!("{e}");
                }
            },
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if stopping {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!("the watcher's socket failed: {e}");
                break;
            }
        }
    }
    summary.close(&comparer);
    summary
}

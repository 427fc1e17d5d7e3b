//! A Horovod-style timeline: spans of one rank's work recorded as Chrome
//! trace events (complete events, `"ph": "X"`), merged on rank 0 into one JSON
//! file that Perfetto and `chrome://tracing` open: one process per rank, one
//! track per thread of work.
//!
//! Tracks ([`Track`]): `main` (the step loop: data wait, forward and backward,
//! the collectives, clipping, the optimizer, the diagnostic, evaluation and
//! checkpoints, each step marked), one per micro-batch (its forward and
//! backward, and in an overlapped pass the backward's levels within it, each
//! ending when its layer's gradients were handed to the engine) and the
//! overlap engine's (each bucket's all-reduce). Categories: `step` (a whole
//! step), `phase` (the main track's top-level work, which never overlaps),
//! `op` (each collective call, within a phase), `micro` (a micro-batch's
//! forward or backward), `level` (a part of backward) and `bucket`.
//!
//! Recording is a push onto a mutex-guarded vector, off when no timeline was
//! asked for ([`Timeline::off`]).

use std::path::Path;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use drove_collective::transport::{Call, CallMode, Delegate};
use drove_collective::{Buffer, Collective, CommError, Element, Gathered, Place};

/// Where a span is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    /// The step loop.
    Main,
    /// Micro-batch `i`'s forward and backward.
    Micro(usize),
    /// The overlap engine: each bucket's all-reduce, from the moment its
    /// last gradient was ready, beside the backward passes.
    Engine,
}

impl Track {
    fn tid(self) -> u64 {
        match self {
            Track::Main => 0,
            Track::Micro(i) => 1 + i as u64,
            Track::Engine => 1000,
        }
    }

    fn name(self) -> String {
        match self {
            Track::Main => "main".into(),
            Track::Micro(i) => format!("micro-batch {i}"),
            Track::Engine => "all-reduce engine".into(),
        }
    }
}

/// A span as recorded: what, where, and when (microseconds since the Unix
/// epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// Its name (`backward`, `gradients.bucket3 all-reduce`, ...).
    pub name: String,
    /// The track it is drawn on.
    pub track: Track,
    /// Start.
    pub start_us: i64,
    /// End.
    pub end_us: i64,
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
struct TraceEvent {
    name: String,
    cat: String,
    /// Start, microseconds since the Unix epoch.
    ts: i64,
    /// Duration, microseconds.
    dur: i64,
    tid: u64,
}

/// One rank's recorder (see the module docs).
#[derive(Debug)]
pub struct Timeline {
    on: bool,
    /// The wall clock and the monotonic clock at creation: spans are timed
    /// monotonically and placed on the wall clock.
    wall0: i64,
    mono0: Instant,
    events: Mutex<Vec<TraceEvent>>,
    tracks: Mutex<Vec<Track>>,
}

impl Timeline {
    /// A recorder that records.
    pub fn on() -> Self {
        let wall0 = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        Timeline {
            on: true,
            wall0,
            mono0: Instant::now(),
            events: Mutex::new(Vec::new()),
            tracks: Mutex::new(vec![Track::Main]),
        }
    }

    /// A recorder that records nothing.
    pub fn off() -> Self {
        Timeline { on: false, ..Timeline::on() }
    }

    /// Whether it records.
    pub fn is_on(&self) -> bool {
        self.on
    }

    fn micros(&self, at: Instant) -> i64 {
        self.wall0 + at.saturating_duration_since(self.mono0).as_micros() as i64
    }

    /// Records `name` from `start` until now.
    pub fn record(&self, name: impl Into<String>, cat: &str, track: Track, start: Instant) {
        if self.on {
            self.record_between(name, cat, track, start, Instant::now());
        }
    }

    /// Records `name` from `start` until `end` (for a span whose end is
    /// known after the fact).
    pub fn record_between(
        &self,
        name: impl Into<String>,
        cat: &str,
        track: Track,
        start: Instant,
        end: Instant,
    ) {
        if !self.on {
            return;
        }
        let event = TraceEvent {
            name: name.into(),
            cat: cat.to_string(),
            ts: self.micros(start),
            dur: end.saturating_duration_since(start).as_micros() as i64,
            tid: track.tid(),
        };
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(event);
        let mut tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        if !tracks.contains(&track) {
            tracks.push(track);
        }
    }

    /// The spans recorded so far on this rank, in the order they ended.
    pub fn spans(&self) -> Vec<Span> {
        let tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events
            .iter()
            .map(|e| Span {
                name: e.name.clone(),
                track: tracks.iter().copied().find(|t| t.tid() == e.tid).unwrap_or(Track::Main),
                start_us: e.ts,
                end_us: e.ts + e.dur,
            })
            .collect()
    }

    /// Runs `work`, recorded as `name`.
    pub fn span<T>(&self, name: impl Into<String>, cat: &str, track: Track, work: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = work();
        self.record(name, cat, track, start);
        out
    }

    /// Gathers every rank's spans onto every rank and, on rank 0, writes them
    /// as one trace-event JSON file at `path`. Every rank calls it.
    pub fn write_merged(&self, comm: &dyn Collective, path: &Path) -> Result<(), TimelineError> {
        let mine = {
            let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
            let tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
            let tracks: Vec<(u64, String)> = tracks.iter().map(|t| (t.tid(), t.name())).collect();
            serde_json::to_vec(&(&*events, tracks)).expect("events serialise")
        };
        let words = pack(&mine);
        let gathered = comm.all_gather("timeline", &[words.len()], i32::tensor_ref(&words))?;
        if comm.rank() != 0 {
            return Ok(());
        }
        let Gathered { data: Buffer::I32(all), first_dims, .. } = gathered else {
            return Err(TimelineError::Malformed("the gathered timeline is not i32".into()));
        };
        let mut trace: Vec<serde_json::Value> = Vec::new();
        let mut offset = 0;
        for (rank, &n) in first_dims.iter().enumerate() {
            let part = unpack(&all[offset..offset + n])
                .ok_or_else(|| TimelineError::Malformed(format!("rank {rank}'s timeline is truncated")))?;
            offset += n;
            let (events, tracks): (Vec<TraceEvent>, Vec<(u64, String)>) = serde_json::from_slice(&part)
                .map_err(|e| TimelineError::Malformed(format!("rank {rank}'s timeline: {e}")))?;
            trace.push(serde_json::json!({
                "name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                "args": {"name": format!("rank {rank}")}
            }));
            trace.push(serde_json::json!({
                "name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}
            }));
            for (tid, name) in tracks {
                trace.push(serde_json::json!({
                    "name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": name}
                }));
            }
            for e in events {
                trace.push(serde_json::json!({
                    "name": e.name, "cat": e.cat, "ph": "X", "ts": e.ts, "dur": e.dur, "pid": rank, "tid": e.tid
                }));
            }
        }
        let doc = serde_json::json!({ "traceEvents": trace, "displayTimeUnit": "ms" });
        let io =
            |e: std::io::Error| TimelineError::Write { path: path.to_path_buf(), message: e.to_string() };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let tmp = path.with_extension("json.partial");
        std::fs::write(&tmp, serde_json::to_vec(&doc).expect("a trace serialises")).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}

/// A timeline that could not be gathered or written.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    /// Gathering failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A rank's part could not be read.
    #[error("timeline: {0}")]
    Malformed(String),
    /// The file could not be written.
    #[error("timeline {path}: {message}")]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        message: String,
    },
}

/// Bytes as i32 words: the length, then the bytes four to a word.
fn pack(bytes: &[u8]) -> Vec<i32> {
    let mut words = Vec::with_capacity(1 + bytes.len().div_ceil(4));
    words.push(bytes.len() as i32);
    words.extend(bytes.chunks(4).map(|c| {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        i32::from_le_bytes(w)
    }));
    words
}

fn unpack(words: &[i32]) -> Option<Vec<u8>> {
    let (&len, rest) = words.split_first()?;
    let len = usize::try_from(len).ok()?;
    let bytes: Vec<u8> = rest.iter().flat_map(|w| w.to_le_bytes()).collect();
    (bytes.len() >= len).then(|| bytes[..len].to_vec())
}

/// A [`Collective`] that records every call on the main track (category
/// `op`) and passes it on.
pub struct Traced<'a> {
    /// The collective called.
    pub inner: &'a dyn Collective,
    /// Where the calls are recorded.
    pub timeline: &'a Timeline,
}

/// Ops that run to their end are recorded; an agreement round or an async
/// op's start passes on unrecorded.
impl Delegate for Traced<'_> {
    fn place(&self) -> Place {
        Place::new(self.inner.rank(), self.inner.world_size()).unwrap_or(Place::SINGLE)
    }

    fn delegate<R>(
        &self,
        call: Call<'_>,
        run: impl FnOnce(&dyn Collective) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        match call.mode {
            CallMode::Blocking => self.timeline.span(call.span_name(), "op", Track::Main, || run(self.inner)),
            CallMode::Agreement | CallMode::Started => run(self.inner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_survive_packing() {
        for n in [0usize, 1, 3, 4, 5, 1000] {
            let bytes: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            assert_eq!(unpack(&pack(&bytes)).as_deref(), Some(&bytes[..]));
        }
        assert_eq!(unpack(&[9, 0]), None, "a length past the words is refused");
    }

    #[test]
    fn an_off_timeline_records_nothing() {
        let t = Timeline::off();
        assert_eq!(t.span("x", "phase", Track::Main, || 7), 7);
        assert!(t.events.lock().unwrap().is_empty());
    }
}

//! The story's bug seen in PyTorch programs nobody changed for it.
//!
//! A team does not change its program to look for a bug it does not know it
//! has. `drove run -- python train.py` puts a watcher into every Python rank
//! ([`PYTHON_WATCHER`], standard library only, on the ranks' `PYTHONPATH`
//! through a `sitecustomize` that then runs the program's own). It notes,
//! for each loader epoch and worker, a fingerprint of every random stream the
//! worker can draw from (a hash of Python's `random`, NumPy's and torch's
//! state, never the state) and which of them the loader drew from; and every
//! N batches the batch's MLM mask. The notes come to the launcher's
//! [`Watcher`] as datagrams, and a [`NoteComparer`] compares them across
//! ranks and workers:
//!
//! - the cause ([`StreamCensus`]): members that started an epoch with a
//!   stream in one state and drew from it draw the same augmentation, the
//!   alarm; one shared but never drawn from is a warning;
//! - the effect ([`BatchMasks`]): the ranks' masks of the same batch compared
//!   by drove-diagnostic's rule (above the 3-sigma band of independent
//!   masks; [`CONFIRMATIONS`] comparisons in a row make the alarm, so a long
//!   correct run does not raise it by chance), which catches a generator no
//!   fingerprint sees.
//!
//! Each alarm says which [`Fix`] applies. The launcher owns where findings
//! go ([`WatchSink`]: a line on rank 0's stderr, the coordinator's points).
//!
//! ```
//! use drove_watch::{Note, NoteComparer};
//!
//! let mut comparer = NoteComparer::new(2);
//! for rank in 0..2 {
//!     let streams = format!(
//!         r#"{{"t":"streams","rank":{rank},"loader":0,"epoch":0,"worker":0,"fp":{{"torch":"same"}}}}"#
//!     );
//!     comparer.add(Note::parse(streams.as_bytes())?);
//!     let drawn = format!(r#"{{"t":"drawn","rank":{rank},"loader":0,"epoch":0,"worker":0,"streams":["torch"]}}"#);
//!     let done = comparer.add(Note::parse(drawn.as_bytes())?);
//!     assert_eq!(done.alarms.len(), rank); // rank 1's draw completes the alarm
//! }
//! # Ok::<(), drove_watch::WatchError>(())
//! ```

#![deny(missing_docs)]

mod census;
mod compare;
mod error;
mod finding;
mod masks;
mod note;
mod program;
mod watcher;

pub use census::{SharedStream, StreamCensus};
pub use compare::{CONFIRMATIONS, Completed, NoteComparer};
pub use error::WatchError;
pub use finding::{Finding, Fix};
pub use masks::{BatchMasks, MaskComparison};
pub use note::{DrawPlace, Drawer, LoaderEpoch, Note, RandomStream};
pub use program::is_python;
pub use watcher::{
    EVERY_VAR, PYTHON_SITECUSTOMIZE, PYTHON_WATCHER, SOCKET_VAR, WatchOptions, WatchSink, WatchSummary,
    Watcher,
};

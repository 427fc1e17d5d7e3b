//! # drove-report: a run as pictures
//!
//! A data-parallel run that masks alike on every rank looks healthy in every
//! figure but one: the loss falls, throughput scales, and only the mask
//! agreement between ranks shows the bug. This crate puts that figure beside
//! the others. A run's points and events, read from a coordinator or straight
//! from its store folder, become charts (each written as PNG and SVG, drawn
//! with plotters) and one self-contained HTML page with a header: the run's
//! id, world size, state, options and the diversity [`RunVerdict`].
//!
//! The one decision everything follows from: a report is a function of a
//! [`RunData`] alone. Both sources give the same type ([`RunData::from_store`]
//! reads the store in place, read-only, beside a coordinator that serves it;
//! [`RunData::from_coordinator`] asks over gRPC), so the same run draws the
//! same charts from either, during the run (the points so far) or after it,
//! and a test or a user's program can build a `RunData` by hand. [`write()`]
//! then puts every file in a folder: `index.html`, `report.json` (every
//! chart's data exactly as drawn) and each chart as `NAME.png` and
//! `NAME.svg`, each through a temporary file and a rename, so a browser
//! reloading the page of a live run never reads half a file.
//!
//! Text is set in DejaVu Sans, compiled in: no system font or fontconfig is
//! needed. An elastic run's changes of world are drawn from what it stored:
//! its `world_size` points as a chart, and its `reform` events as rules on the
//! loss. Nothing here prints; what was written comes back as [`Written`].
//!
//! - [`RunData`], [`Event`], [`Point`]: the run as read, from either [`Source`].
//! - [`charts`]: what is drawn ([`charts::Chart`]), built from the points, and
//!   the drawing itself.
//! - [`RunVerdict`]: whether the ranks' masks were independent, as far as the
//!   run tells.
//! - [`write()`]: the files.
//!
//! ```no_run
//! let run = drove_report::RunData::from_store("runs/four/store".as_ref(), None)?;
//! let written = drove_report::write(&run, "report".as_ref())?;
//! assert_eq!(written.index, std::path::Path::new("report/index.html"));
//! # Ok::<(), drove_report::ReportError>(())
//! ```
#![deny(missing_docs)]

pub mod charts;
mod coordinator;
mod data;
mod error;
mod page;
mod time;
mod verdict;
mod write;

pub use data::{Event, Point, RunData, Source, load};
pub use drove_proto::v1::RunState;
pub use error::{DrawError, ReportError};
pub use time::utc;
pub use verdict::RunVerdict;
pub use write::{Written, write};

/// The PNG codec the charts are encoded with: its error is in
/// [`DrawError::Png`], and a reader of the charts can decode them with it.
pub use png;

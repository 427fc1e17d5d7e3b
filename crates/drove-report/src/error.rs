//! What stops a report.

use std::path::PathBuf;

use drove_store::StoreError;

/// A report that could not be read or written. Each message names what was
/// being done and where, with its cause in the message itself.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The folder holds no coordinator store.
    #[error("no coordinator store at {} (no coordinator.db in it)", .0.display())]
    NoStore(PathBuf),
    /// The store could not be opened.
    #[error("opening the store {}: {cause}", dir.display())]
    OpenStore {
        /// The store folder.
        dir: PathBuf,
        /// The cause.
        cause: StoreError,
    },
    /// The store could not be read.
    #[error("reading {at}: {cause}")]
    ReadStore {
        /// The store, in words.
        at: String,
        /// The cause.
        cause: StoreError,
    },
    /// The run asked for is not there.
    #[error("{at} knows no run {wanted:?} (runs there: {known})")]
    UnknownRun {
        /// The store or coordinator, in words.
        at: String,
        /// The run asked for.
        wanted: String,
        /// The runs there are, comma-separated (`none`).
        known: String,
    },
    /// There is no run at all.
    #[error("{at} knows no runs")]
    NoRuns {
        /// The store or coordinator, in words.
        at: String,
    },
    /// The coordinator cannot be reached.
    #[error(transparent)]
    Connect(#[from] drove_control::ConnectError),
    /// The coordinator refused a call, or the call failed.
    #[error("{0}")]
    Status(String),
    /// The coordinator did not give the run's points.
    #[error("querying the points of run {run:?}: {message}")]
    Query {
        /// The run.
        run: String,
        /// The call's status, in words.
        message: String,
    },
    /// No async runtime for the gRPC calls.
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
    /// A chart could not be drawn.
    #[error("drawing chart {chart:?} as {format}: {cause}")]
    Draw {
        /// The chart's id.
        chart: String,
        /// `SVG` or `PNG`.
        format: &'static str,
        /// The cause.
        cause: DrawError,
    },
    /// A file or folder could not be made.
    #[error("{what} {}: {cause}", path.display())]
    Io {
        /// What was being done: `creating`, `writing`.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// A written file could not take its place.
    #[error("renaming {} to {}: {cause}", from.display(), to.display())]
    Rename {
        /// The temporary file.
        from: PathBuf,
        /// Its place.
        to: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// `report.json` could not be serialised.
    #[error("serialising report.json: {0}")]
    Json(serde_json::Error),
}

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum DrawError {
    /// The compiled-in font did not register.
    #[error("the compiled-in DejaVu Sans font did not load")]
    Font,
    /// plotters failed.
    #[error("{0}")]
    Plot(String),
    /// The PNG encoder failed.
    #[error("{0}")]
    Png(png::EncodingError),
}

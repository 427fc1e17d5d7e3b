//! What can go wrong watching.

/// A watcher failure.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// A note that is not what the watcher writes (the note is dropped).
    #[error("a watcher note could not be read: {0}")]
    Note(String),
    /// The watcher's folder or socket could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

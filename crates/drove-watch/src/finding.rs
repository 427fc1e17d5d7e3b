//! What the watcher tells: the alarm or a warning, and which fix applies.

use std::fmt;

use crate::census::SharedStream;
use crate::masks::MaskComparison;

/// The fix for what was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fix {
    /// Seed each loader worker from its rank and id.
    WorkerInitFn,
    /// Seed each rank's main process differently.
    PerRankSeed,
    /// A library's own seeding option draws alike on every rank.
    LibraryOption,
}

impl fmt::Display for Fix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fix::WorkerInitFn => {
                "seed each loader worker from its rank and worker id: \
                 DataLoader(..., worker_init_fn=drove.torch.worker_init_fn(seed)) (PyTorch seeds worker k \
                 from a base seed the main process draws, the same on every rank seeded alike)"
            }
            Fix::PerRankSeed => {
                "seed each rank differently (seed + rank, or drove.torch.seed_process with the rank's \
                 StreamKey): the main process draws the augmentation, and every rank seeded it alike"
            }
            Fix::LibraryOption => {
                "a generator no fingerprint sees draws the masks alike on every rank: a library's own \
                 seeding option (transformers' DataCollatorForLanguageModeling(seed=...) seeds worker k \
                 of every rank alike); drop the option, or add the rank to its seed"
            }
        })
    }
}

/// What one note completed.
#[derive(Clone, Debug, PartialEq)]
pub enum Finding {
    /// Members drew from a stream in one state: the diversity alarm.
    SharedStream(SharedStream),
    /// One batch's masks agree beyond the band of independent masks.
    Masks(MaskComparison),
}

impl Finding {
    /// Whether it is the diversity alarm.
    pub fn is_alarm(&self) -> bool {
        match self {
            Finding::SharedStream(s) => s.drawn,
            Finding::Masks(c) => c.report.is_alarm(),
        }
    }

    /// Which fix applies (for masks, with no stream found shared: a library's
    /// own option; `streams_shared` says a stream alarm came first).
    pub fn fix(&self, streams_shared: bool) -> Fix {
        match self {
            Finding::SharedStream(s) if s.in_workers() => Fix::WorkerInitFn,
            Finding::SharedStream(_) => Fix::PerRankSeed,
            Finding::Masks(_) if streams_shared => Fix::WorkerInitFn,
            Finding::Masks(_) => Fix::LibraryOption,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::SharedStream(s) if s.drawn => write!(f, "{s}, and the loader drew from it there"),
            Finding::SharedStream(s) => write!(f, "{s}, but the loader never drew from it"),
            Finding::Masks(c) => write!(
                f,
                "the MLM masks of batch {} ({}) {}",
                c.batch,
                c.at,
                c.report.explain().split(". ").next().unwrap_or_default().to_lowercase()
            ),
        }
    }
}

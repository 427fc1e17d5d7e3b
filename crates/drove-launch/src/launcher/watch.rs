//! The watcher in every Python rank (drove-watch): on by default for a
//! Python program, its notes compared here, and what it finds on rank 0's
//! stderr and in the coordinator, as `drove train ner`'s diversity alarm is.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use drove_metrics::metric_names::{
    self, DIVERSITY_ALARM, MASK_AGREEMENT, MASK_AGREEMENT_EXPECTED, MASK_AGREEMENT_SIGMA, WORLD_SIZE,
};
use drove_metrics::{MetricsRecorder, Reading, RecorderOptions, RecorderTarget};
use drove_watch::{Finding, Fix, MaskComparison, WatchOptions, WatchSink, WatchSummary, Watcher};

use crate::launcher::console::{Console, Stream};

/// Batches between two mask notes of a loader, unless the launch's
/// environment says otherwise (`DROVE_WATCH_EVERY`).
pub const DEFAULT_WATCH_EVERY: u32 = 10;

/// Whether the ranks are watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WatchChoice {
    /// When the program is a Python interpreter or a `.py` file.
    #[default]
    Auto,
    /// Always (`drove run --watch`): a program that starts Python later.
    On,
    /// Never (`drove run --no-watch`).
    Off,
}

impl WatchChoice {
    /// Whether a launch of `program` is watched.
    pub fn applies(self, program: &OsStr) -> bool {
        match self {
            WatchChoice::Auto => drove_watch::is_python(program),
            WatchChoice::On => true,
            WatchChoice::Off => false,
        }
    }
}

/// Where the coordinator is, for the watcher's points.
pub(crate) struct WatchTarget<'a> {
    pub addr: &'a str,
    pub token: Option<&'a str>,
    pub run_id: &'a str,
    pub world_size: usize,
}

/// A running watch and the sink it reports to.
pub(crate) struct LaunchWatch {
    watcher: Watcher,
    console: Arc<dyn Console>,
}

impl LaunchWatch {
    /// Starts watching; a watch that cannot start is said once and skipped.
    pub(crate) fn start(target: &WatchTarget<'_>, console: &Arc<dyn Console>) -> Option<LaunchWatch> {
        let recorder = MetricsRecorder::new(
            RecorderTarget { address: target.addr, token: target.token, run_id: target.run_id, rank: 0 },
            RecorderOptions::default(),
        )
        .map_err(|e| tracing::warn!("the watcher records no points: {e}"))
        .ok();
        let every = match std::env::var(drove_watch::EVERY_VAR) {
            Err(_) => DEFAULT_WATCH_EVERY,
            Ok(v) => match v.trim().parse::<u32>() {
                Ok(n) if n > 0 => n,
                _ => {
                    console.note(&format!(
                        "drove-watch: {}={v:?} is not a count of batches (1 or more); comparing masks every \
                         {DEFAULT_WATCH_EVERY} batches",
                        drove_watch::EVERY_VAR
                    ));
                    DEFAULT_WATCH_EVERY
                }
            },
        };
        let sink =
            ConsoleSink { console: console.clone(), recorder, every, compared: 0, world: target.world_size };
        match Watcher::start(WatchOptions { world_size: target.world_size, every }, Box::new(sink)) {
            Ok(watcher) => Some(LaunchWatch { watcher, console: console.clone() }),
            Err(e) => {
                console.note(&format!("drove-watch: cannot watch the ranks: {e}"));
                None
            }
        }
    }

    /// The variables every rank gets.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        self.watcher.env(std::env::var_os("PYTHONPATH"))
    }

    /// Stops watching; the warnings go to rank 0's stderr.
    pub(crate) fn finish(self) -> WatchSummary {
        let summary = self.watcher.finish();
        let line = format!("drove-watch: {}\n", summary.describe());
        let _ = self.console.line(0, Stream::Stderr, line.as_bytes());
        for alarm in &summary.alarmed {
            let line = format!("drove-watch: diversity alarm, in full: {alarm}\n");
            let _ = self.console.line(0, Stream::Stderr, line.as_bytes());
        }
        for warning in &summary.warnings {
            let line = format!("drove-watch: warning: {warning}\n");
            let _ = self.console.line(0, Stream::Stderr, line.as_bytes());
        }
        summary
    }
}

/// Rank 0's stderr and the coordinator's points.
struct ConsoleSink {
    console: Arc<dyn Console>,
    recorder: Option<MetricsRecorder>,
    every: u32,
    compared: u64,
    world: usize,
}

impl ConsoleSink {
    fn record(&self, step: f64, name: &str, value: f64) {
        if let Some(r) = &self.recorder {
            r.record(Reading { step, name, value });
        }
    }
}

impl WatchSink for ConsoleSink {
    fn alarm(&mut self, finding: &Finding, fix: Fix) {
        let text = format!("{finding}. Fix: {fix}");
        let line = format!("drove-watch: diversity alarm: {text}\n");
        let _ = self.console.line(0, Stream::Stderr, line.as_bytes());
        let step = (self.compared * u64::from(self.every)) as f64;
        self.record(step, DIVERSITY_ALARM, 1.0);
        if let Some(r) = &self.recorder
            && let Err(e) = r.event(step, metric_names::event::DIVERSITY_ALARM, &text, Duration::from_secs(2))
        {
            tracing::warn!("the diversity alarm's event was not delivered: {e}");
        }
    }

    fn compared(&mut self, comparison: &MaskComparison) {
        let step = (self.compared * u64::from(self.every)) as f64;
        self.compared += 1;
        let r = &comparison.report;
        self.record(step, MASK_AGREEMENT, r.mean_agreement);
        self.record(step, MASK_AGREEMENT_EXPECTED, r.expected);
        self.record(step, MASK_AGREEMENT_SIGMA, r.sigma);
        self.record(step, WORLD_SIZE, self.world as f64);
    }
}

impl Drop for ConsoleSink {
    fn drop(&mut self) {
        if let Some(r) = self.recorder.take() {
            let delivery = r.close();
            if delivery.undelivered() > 0 {
                tracing::warn!("the watcher's points: {delivery:?}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_programs_are_watched_by_default_and_the_flags_force_either_way() {
        assert!(WatchChoice::Auto.applies(OsStr::new("python3")));
        assert!(WatchChoice::Auto.applies(OsStr::new("train.py")));
        assert!(!WatchChoice::Auto.applies(OsStr::new("drove")));
        assert!(WatchChoice::On.applies(OsStr::new("bash")));
        assert!(!WatchChoice::Off.applies(OsStr::new("python3")));
    }
}

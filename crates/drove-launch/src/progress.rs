//! The progress line: rank 0 tells the launcher how far the run is, and the
//! launcher draws it (one bar for the whole world on a terminal).
//!
//! A line is [`PROGRESS_PREFIX`] followed by one JSON object, a [`Progress`],
//! on the rank's stderr. The rank writes it with [`Progress::line`], the
//! launcher reads it with [`Progress::parse_line`]: one type on both sides.

use serde::{Deserialize, Serialize};

/// The prefix of a progress line (then one JSON [`Progress`]).
pub const PROGRESS_PREFIX: &str = "drove-progress ";

/// Who shows rank 0's progress (`DROVE_PROGRESS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProgressMode {
    /// The rank itself (its own bar or log lines): `DROVE_PROGRESS` unset.
    #[default]
    Rank,
    /// The launcher: rank 0 writes progress lines and prints no bar
    /// (`DROVE_PROGRESS=launcher`).
    Launcher,
}

impl ProgressMode {
    /// The value `DROVE_PROGRESS` takes for this mode (`None`: unset).
    pub fn value(self) -> Option<&'static str> {
        match self {
            ProgressMode::Rank => None,
            ProgressMode::Launcher => Some("launcher"),
        }
    }
}

impl std::str::FromStr for ProgressMode {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "launcher" => Ok(ProgressMode::Launcher),
            _ => Err(()),
        }
    }
}

/// How far a run is: what one progress line carries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Steps done (the bar's position).
    pub step: u64,
    /// Steps in the whole run (the bar's length).
    pub total: u64,
    /// The epoch, when the run has epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The latest training loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    /// Throughput in samples per second, over all ranks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_s: Option<f64>,
    /// What a sample is, for the bar (e.g. `sent`); `samples` if unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl Progress {
    /// Progress at `step` of `total`, with nothing else known yet.
    pub fn at(step: u64, total: u64) -> Self {
        Progress { step, total, ..Progress::default() }
    }

    /// The line a rank writes (without the newline).
    pub fn line(&self) -> String {
        format!("{PROGRESS_PREFIX}{}", serde_json::to_string(self).expect("a Progress serialises"))
    }

    /// Writes [`line`](Self::line) to stderr, for the launcher to read.
    pub fn send(&self) {
        eprintln!("{}", self.line());
    }

    /// The progress a line carries, or `None` if it is not a progress line
    /// (or one this version cannot read).
    pub fn parse_line(line: &[u8]) -> Option<Progress> {
        let json = line.strip_prefix(PROGRESS_PREFIX.as_bytes())?;
        serde_json::from_slice(json.trim_ascii_end()).ok()
    }

    /// The bar's message: `epoch E loss L R unit/s`, with what is known.
    pub fn message(&self) -> String {
        let mut parts = Vec::new();
        if let Some(e) = self.epoch {
            parts.push(format!("epoch {e}"));
        }
        if let Some(l) = self.loss {
            parts.push(format!("loss {l:.4}"));
        }
        if let Some(r) = self.samples_per_s {
            parts.push(format!("{r:.1} {}/s", self.unit.as_deref().unwrap_or("samples")));
        }
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_written_by_a_rank_reads_back_the_same() {
        let p = Progress {
            step: 7,
            total: 90,
            epoch: Some(1),
            loss: Some(0.25),
            samples_per_s: Some(12.5),
            unit: Some("sent".into()),
        };
        let line = format!("{}\n", p.line());
        assert!(line.starts_with(PROGRESS_PREFIX));
        assert_eq!(Progress::parse_line(line.as_bytes()), Some(p.clone()));
        assert_eq!(p.message(), "epoch 1 loss 0.2500 12.5 sent/s");
        let start = Progress::at(3, 10);
        assert_eq!(start.line(), "drove-progress {\"step\":3,\"total\":10}");
        assert_eq!(Progress::parse_line(start.line().as_bytes()), Some(start));
    }

    #[test]
    fn other_lines_are_not_progress() {
        assert_eq!(Progress::parse_line(b"step 3/10 loss 1.0\n"), None);
        assert_eq!(Progress::parse_line(b"drove-progress {not json}\n"), None);
        assert_eq!(Progress::parse_line(b"drove-progress {\"step\":1}\n"), None, "total is required");
    }

    #[test]
    fn the_mode_is_launcher_or_unset() {
        assert_eq!("launcher".parse(), Ok(ProgressMode::Launcher));
        assert!("bar".parse::<ProgressMode>().is_err());
        assert_eq!(ProgressMode::Launcher.value(), Some("launcher"));
        assert_eq!(ProgressMode::Rank.value(), None);
    }
}

//! The diversity verdict of a run: whether its ranks' masks were independent,
//! as far as its events and its mask-agreement chart tell.

use drove_proto::metric_names;
use serde::Serialize;

use crate::RunData;
use crate::charts::{self, Chart};

/// What the run tells of its masks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictStatus {
    /// The diversity alarm went off.
    Alarm,
    /// Every diagnosed step within the band of independent masks.
    Diverse,
    /// Some steps outside the band, no alarm.
    Outliers,
    /// No step was diagnosed.
    NotDiagnosed,
}

impl VerdictStatus {
    /// Its word, as in `report.json` (and the page's CSS class).
    pub fn word(self) -> &'static str {
        match self {
            VerdictStatus::Alarm => "alarm",
            VerdictStatus::Diverse => "diverse",
            VerdictStatus::Outliers => "outliers",
            VerdictStatus::NotDiagnosed => "not_diagnosed",
        }
    }
}

/// Whether the ranks' masks were independent, as far as the run tells.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// `alarm`, `diverse`, `outliers` or `not_diagnosed`.
    pub status: VerdictStatus,
    /// What it means, in words.
    pub text: String,
}

impl Verdict {
    /// The verdict of `run` and its mask-agreement chart, if any.
    pub fn of(run: &RunData, masks: Option<&Chart>) -> Verdict {
        if let Some(alarm) = run.events.iter().find(|e| e.kind == metric_names::event::DIVERSITY_ALARM) {
            return Verdict {
                status: VerdictStatus::Alarm,
                text: format!(
                    "Diversity alarm at step {} (rank {}): {}",
                    alarm.step, alarm.rank, alarm.message
                ),
            };
        }
        let Some((agreement, outside)) = masks.and_then(charts::outside_band) else {
            return Verdict {
                status: VerdictStatus::NotDiagnosed,
                text: "Masks not diagnosed: masking augmentation off, a single rank, or --diagnose-every 0."
                    .into(),
            };
        };
        let n = agreement.len();
        let mean = agreement.iter().sum::<f64>() / n as f64;
        if outside == 0 {
            Verdict {
                status: VerdictStatus::Diverse,
                text: format!(
                    "Independent masks: agreement within the 3-sigma band of independent masks at all {n} \
                     diagnosed step(s) (mean {mean:.4})."
                ),
            }
        } else {
            Verdict {
                status: VerdictStatus::Outliers,
                text: format!(
                    "{outside} of {n} diagnosed step(s) outside the 3-sigma band (mean agreement {mean:.4}), \
                     but no diversity alarm: the alarm judges every diagnosed step so far together."
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_serialise_as_their_words() {
        for s in [
            VerdictStatus::Alarm,
            VerdictStatus::Diverse,
            VerdictStatus::Outliers,
            VerdictStatus::NotDiagnosed,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.word());
        }
    }
}

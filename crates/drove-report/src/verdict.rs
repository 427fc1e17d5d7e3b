//! The diversity verdict of a run: whether its ranks' masks were independent,
//! as far as its events and its mask-agreement chart tell, in
//! `drove-diagnostic`'s one vocabulary.

use drove_diagnostic::Verdict;
use drove_proto::metric_names;
use serde::Serialize;

use crate::RunData;
use crate::charts::{self, Chart};

/// Whether a run's ranks drew independent masks, and what that means.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunVerdict {
    /// `identical` or `anticorrelated` (the alarm went off), `diverse`,
    /// `outliers` or `not_diagnosed`.
    pub status: Verdict,
    /// What it means, in words.
    pub text: String,
}

impl RunVerdict {
    /// The verdict of `run` and its mask-agreement chart, if any.
    pub fn of(run: &RunData, masks: Option<&Chart>) -> RunVerdict {
        let sides = masks.and_then(charts::band_sides);
        if let Some(alarm) = run.events.iter().find(|e| e.kind == metric_names::event::DIVERSITY_ALARM) {
            // The alarm's own words say which; the chart says it as a type.
            let status = match &sides {
                Some(s) if s.below > s.above => Verdict::AntiCorrelated,
                _ => Verdict::Identical,
            };
            return RunVerdict {
                status,
                text: format!(
                    "Diversity alarm at step {} (rank {}): {}",
                    alarm.step, alarm.rank, alarm.message
                ),
            };
        }
        let Some(sides) = sides else {
            return RunVerdict {
                status: Verdict::NotDiagnosed,
                text: "Masks not diagnosed: masking augmentation off, a single rank, or --diagnose-every 0."
                    .into(),
            };
        };
        let n = sides.agreement.len();
        let mean = sides.agreement.iter().sum::<f64>() / n as f64;
        let outside = sides.above + sides.below;
        if outside == 0 {
            RunVerdict {
                status: Verdict::Diverse,
                text: format!(
                    "Independent masks: agreement within the 3-sigma band of independent masks at all {n} \
                     diagnosed step(s) (mean {mean:.4})."
                ),
            }
        } else {
            RunVerdict {
                status: Verdict::Outliers,
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
    use crate::{Event, Point};

    /// A run of two ranks whose mask agreement is `agreement` at steps 1, 2, ...
    /// (independent masks: 0.745 +- 3 x 0.01), with the alarm if `alarm`.
    fn run(agreement: &[f64], alarm: bool) -> RunData {
        let p = |name: &str, step: f64, value: f64| Point { name: name.into(), step, rank: 0, value };
        let mut points = Vec::new();
        for (i, &a) in agreement.iter().enumerate() {
            let step = (i + 1) as f64;
            points.push(p(metric_names::MASK_AGREEMENT, step, a));
            points.push(p(metric_names::MASK_AGREEMENT_EXPECTED, step, 0.745));
            points.push(p(metric_names::MASK_AGREEMENT_SIGMA, step, 0.01));
        }
        let events = alarm
            .then(|| Event {
                rank: 0,
                step: agreement.len() as f64,
                kind: metric_names::event::DIVERSITY_ALARM.into(),
                message: "masks".into(),
                wall_time_unix_ms: 0,
            })
            .into_iter()
            .collect();
        RunData { events, ..crate::charts::tests::run(points) }
    }

    fn status(agreement: &[f64], alarm: bool) -> Verdict {
        let r = run(agreement, alarm);
        let charts = charts::build(&r);
        RunVerdict::of(&r, charts.iter().find(|c| c.id == metric_names::MASK_AGREEMENT)).status
    }

    #[test]
    fn a_run_speaks_the_diagnostic_s_words() {
        assert_eq!(status(&[0.75, 0.74], false), Verdict::Diverse);
        assert_eq!(status(&[0.75, 0.99], false), Verdict::Outliers);
        assert_eq!(status(&[1.0, 1.0], true), Verdict::Identical);
        assert_eq!(status(&[0.5, 0.5], true), Verdict::AntiCorrelated);
        assert_eq!(status(&[], false), Verdict::NotDiagnosed);
    }
}

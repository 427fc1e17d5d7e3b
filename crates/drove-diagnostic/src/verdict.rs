//! The one verdict vocabulary: what a diagnosed step, or a whole run, tells of
//! its ranks' masks.

use serde::Serialize;

/// What the masks tell: the word a step's [`AgreementReport`], `drove report`'s
/// page and `report.json`, and the Python package all use.
///
/// A step is [`Diverse`](Verdict::Diverse), [`Identical`](Verdict::Identical)
/// or [`AntiCorrelated`](Verdict::AntiCorrelated) (or
/// [`NotDiagnosed`](Verdict::NotDiagnosed) when no position was compared); a
/// run may also be [`Outliers`](Verdict::Outliers): some steps outside the
/// band, no alarm. The two alarms are identical and anti-correlated masks.
///
/// [`AgreementReport`]: crate::AgreementReport
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Agreement within the 3-sigma band of independent masks.
    Diverse,
    /// Agreement above the band: the ranks draw the same masks (the alarm).
    Identical,
    /// Agreement below the band: the ranks' masks are complementary rather
    /// than independent (the alarm too).
    #[serde(rename = "anticorrelated")]
    AntiCorrelated,
    /// A run with some diagnosed steps outside the band but no alarm (the
    /// alarm judges every diagnosed step so far together).
    Outliers,
    /// Nothing compared: masking off, one rank, or no diagnosed step.
    NotDiagnosed,
}

impl Verdict {
    /// Every verdict, in the order above.
    pub const ALL: [Verdict; 5] = [
        Verdict::Diverse,
        Verdict::Identical,
        Verdict::AntiCorrelated,
        Verdict::Outliers,
        Verdict::NotDiagnosed,
    ];

    /// Its word: `diverse`, `identical`, `anticorrelated`, `outliers` or
    /// `not_diagnosed` (as serialised).
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Diverse => "diverse",
            Verdict::Identical => "identical",
            Verdict::AntiCorrelated => "anticorrelated",
            Verdict::Outliers => "outliers",
            Verdict::NotDiagnosed => "not_diagnosed",
        }
    }

    /// What it says of the masks, in a few words (a summary line's):
    /// `within 3 sigma` (of independent masks), `ranks mask alike`, `below
    /// the band`, `some steps outside the band`, `not diagnosed`.
    /// [`AgreementReport::explain`](crate::AgreementReport::explain) says it
    /// at length, with what to do.
    pub fn meaning(self) -> &'static str {
        match self {
            Verdict::Diverse => "within 3 sigma",
            Verdict::Identical => "ranks mask alike",
            Verdict::AntiCorrelated => "below the band",
            Verdict::Outliers => "some steps outside the band",
            Verdict::NotDiagnosed => "not diagnosed",
        }
    }

    /// Whether it is the diversity alarm: masks identical across ranks, or
    /// anti-correlated (anything but independent).
    pub fn is_alarm(self) -> bool {
        matches!(self, Verdict::Identical | Verdict::AntiCorrelated)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verdict_serialises_as_its_word_and_only_two_are_alarms() {
        for v in Verdict::ALL {
            assert_eq!(serde_json::to_value(v).unwrap(), v.word());
            assert_eq!(v.to_string(), v.word());
        }
        let meanings: std::collections::HashSet<_> = Verdict::ALL.map(Verdict::meaning).into();
        assert_eq!(meanings.len(), Verdict::ALL.len(), "each verdict its own meaning");
        let alarms: Vec<_> = Verdict::ALL.into_iter().filter(|v| v.is_alarm()).collect();
        assert_eq!(alarms, [Verdict::Identical, Verdict::AntiCorrelated]);
    }
}

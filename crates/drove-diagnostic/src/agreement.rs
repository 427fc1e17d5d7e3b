//! Mask agreement: how often two ranks' masks of their own batches agree.
//!
//! At a step, each rank's mask of *its own* batch is compared position by position
//! with every other rank's, at positions maskable on both (row `i` with row `i`,
//! position `j` with position `j`). Independent masks with probability `p` agree
//! with probability `p^2 + (1-p)^2` (0.745 at 0.15); identical masks always agree.
//! A shared batch is never used: with per-sample streams the same sample gets the
//! same mask by design, which would read as the bug.

use crate::Verdict;

/// Agreement of two independent Bernoulli(`p`) masks: `p^2 + (1-p)^2`.
pub fn expected_agreement(p: f64) -> f64 {
    p * p + (1.0 - p) * (1.0 - p)
}

/// One rank's mask of one batch: which positions were chosen and which could be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowMasks {
    /// Padded width.
    pub width: usize,
    /// Chosen positions, row-major.
    pub chosen: Vec<bool>,
    /// Maskable positions, row-major.
    pub maskable: Vec<bool>,
}

impl RowMasks {
    /// Rows: positions over the width.
    pub fn rows(&self) -> usize {
        self.chosen.len().checked_div(self.width).unwrap_or(0)
    }

    /// `(agreeing, compared)` positions between two masks: rows and positions
    /// paired by index, counted where maskable on both.
    pub fn compare(&self, other: &RowMasks) -> (u64, u64) {
        let rows = self.rows().min(other.rows());
        let width = self.width.min(other.width);
        let (mut agree, mut compared) = (0u64, 0u64);
        for r in 0..rows {
            for j in 0..width {
                let (a, b) = (r * self.width + j, r * other.width + j);
                if self.maskable[a] && other.maskable[b] {
                    compared += 1;
                    agree += u64::from(self.chosen[a] == other.chosen[b]);
                }
            }
        }
        (agree, compared)
    }
}

/// Agreement of one pair of ranks.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PairAgreement {
    /// First rank.
    pub a: usize,
    /// Second rank.
    pub b: usize,
    /// Fraction of compared positions where the masks agree.
    pub agreement: f64,
    /// Positions compared.
    pub compared: u64,
}

/// The diagnostic's result.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AgreementReport {
    /// Ranks compared.
    pub world_size: usize,
    /// Mask probability.
    pub probability: f64,
    /// Steps compared.
    pub steps: usize,
    /// Every pair of ranks.
    pub pairs: Vec<PairAgreement>,
    /// Rank-by-rank agreement (1.0 on the diagonal).
    pub matrix: Vec<Vec<f64>>,
    /// Mean over pairs.
    pub mean_agreement: f64,
    /// `p^2 + (1-p)^2`.
    pub expected: f64,
    /// Standard deviation of `mean_agreement` for independent masks.
    pub sigma: f64,
    /// `(mean - expected) / (1 - expected)`: 0 for independent, 1 for identical.
    pub normalised: f64,
    /// Whether the mean lies within `expected +- 3 sigma`.
    pub within_3_sigma: bool,
    /// [`Verdict::Diverse`], [`Verdict::Identical`] or [`Verdict::AntiCorrelated`].
    pub verdict: Verdict,
}

impl AgreementReport {
    /// Whether this is the diversity alarm: masks identical across ranks, or
    /// anti-correlated (anything but independent).
    pub fn is_alarm(&self) -> bool {
        self.verdict.is_alarm() && self.expected < 1.0
    }

    /// What the verdict means and, for an alarm, what to do: the words that
    /// `drove diag masks` and the training alarm share.
    pub fn explain(&self) -> String {
        if self.expected >= 1.0 {
            return format!(
                "At probability {} every mask is the same whatever the seeding, so agreement cannot tell \
                 seedings apart.",
                self.probability
            );
        }
        let z = (self.mean_agreement - self.expected) / self.sigma;
        match self.verdict {
            Verdict::Identical => format!(
                "Identical masks: agreement {:.4} is {z:.1} sigma above the {:.4} of independent masks. \
                 Every rank and worker drew the same random stream, so the augmentation is identical across \
                 ranks and the extra ranks add no augmentation diversity. Derive each rank's and worker's \
                 stream from its own key (drove's --seeding derived, the default, or drove_seed::StreamKey; \
                 in PyTorch, seed each rank and each DataLoader worker differently).",
                self.mean_agreement, self.expected
            ),
            Verdict::AntiCorrelated => format!(
                "Anti-correlated masks: agreement {:.4} is {:.1} sigma below the {:.4} of independent masks. \
                 The ranks do not share masks, but their streams are related rather than independent \
                 (complementary masks); derive each rank's stream from its own key.",
                self.mean_agreement, -z, self.expected
            ),
            Verdict::Diverse => format!(
                "Each rank masks independently: agreement is within 3 sigma of p^2+(1-p)^2 (z = {z:.1}), \
                 as data-parallel augmentation should be."
            ),
            // What a run may say, never one comparison ([`AgreementAccumulator::report`]).
            Verdict::Outliers | Verdict::NotDiagnosed => format!(
                "Mean agreement {:.4} against {:.4} for independent masks (z = {z:.1}).",
                self.mean_agreement, self.expected
            ),
        }
    }
}

/// Accumulates mask comparisons across ranks over many steps.
#[derive(Clone, Debug)]
pub struct AgreementAccumulator {
    world_size: usize,
    probability: f64,
    steps: usize,
    counts: Vec<(u64, u64)>, // per pair (a < b), in order
}

impl AgreementAccumulator {
    /// For `world_size` ranks masking with probability `probability`.
    pub fn new(world_size: usize, probability: f64) -> Self {
        let pairs = world_size * world_size.saturating_sub(1) / 2;
        AgreementAccumulator { world_size, probability, steps: 0, counts: vec![(0, 0); pairs] }
    }

    /// Adds one step: `masks[r]` is rank `r`'s mask of its batch at that step.
    ///
    /// # Panics
    /// If `masks` does not hold one entry per rank.
    pub fn add_step(&mut self, masks: &[RowMasks]) {
        assert_eq!(masks.len(), self.world_size, "one mask per rank");
        let mut k = 0;
        for a in 0..self.world_size {
            for b in a + 1..self.world_size {
                let (agree, compared) = masks[a].compare(&masks[b]);
                self.counts[k].0 += agree;
                self.counts[k].1 += compared;
                k += 1;
            }
        }
        self.steps += 1;
    }

    /// The mask probability compared against.
    pub fn probability(&self) -> f64 {
        self.probability
    }

    /// The report so far.
    #[allow(clippy::needless_range_loop)] // a symmetric matrix reads best indexed
    pub fn report(&self) -> AgreementReport {
        let w = self.world_size;
        let p = self.probability;
        let expected = expected_agreement(p);
        let mut matrix = vec![vec![1.0; w]; w];
        let mut pairs = Vec::with_capacity(self.counts.len());
        let mut k = 0;
        for a in 0..w {
            for b in a + 1..w {
                let (agree, compared) = self.counts[k];
                let agreement = if compared == 0 { f64::NAN } else { agree as f64 / compared as f64 };
                matrix[a][b] = agreement;
                matrix[b][a] = agreement;
                pairs.push(PairAgreement { a, b, agreement, compared });
                k += 1;
            }
        }
        let n_pairs = pairs.len().max(1) as f64;
        let mean_agreement = pairs.iter().map(|p| p.agreement).sum::<f64>() / n_pairs;
        // Variance of the mean over pairs for independent masks: each pair is a
        // Bernoulli(expected) per position; two pairs sharing a rank are correlated
        // (covariance p^3 + q^3 - expected^2), and each pair shares a rank with
        // 2(W-2) others.
        let total: u64 = pairs.iter().map(|p| p.compared).sum();
        let per_pair = total as f64 / n_pairs;
        let q = 1.0 - p;
        let var = expected * (1.0 - expected);
        let cov = p.powi(3) + q.powi(3) - expected * expected;
        let sigma = if per_pair > 0.0 {
            ((var + 2.0 * (w as f64 - 2.0).max(0.0) * cov) / (n_pairs * per_pair)).sqrt()
        } else {
            f64::NAN
        };
        let normalised =
            if expected < 1.0 { (mean_agreement - expected) / (1.0 - expected) } else { f64::NAN };
        let within_3_sigma = (mean_agreement - expected).abs() <= 3.0 * sigma;
        let verdict = if mean_agreement > expected + 3.0 * sigma {
            Verdict::Identical
        } else if mean_agreement < expected - 3.0 * sigma {
            Verdict::AntiCorrelated
        } else {
            Verdict::Diverse
        };
        AgreementReport {
            world_size: w,
            probability: p,
            steps: self.steps,
            pairs,
            matrix,
            mean_agreement,
            expected,
            sigma,
            normalised,
            within_3_sigma,
            verdict,
        }
    }
}

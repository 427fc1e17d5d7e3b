//! Learning-rate scaling with the world size, and the one schedule of the rate
//! over a run: constant, or BERT fine-tuning's warmup + linear decay.

use std::fmt;
use std::str::FromStr;

/// How the learning rate grows with the number of ranks (the global batch grows
/// with them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrScaling {
    /// Keep the base rate.
    None,
    /// Multiply by the world size (Horovod's default).
    #[default]
    Linear,
    /// Multiply by its square root.
    Sqrt,
}

impl LrScaling {
    /// The rate for `world` ranks.
    pub fn scale(self, base: f64, world: usize) -> f64 {
        match self {
            LrScaling::None => base,
            LrScaling::Linear => base * world as f64,
            LrScaling::Sqrt => base * (world as f64).sqrt(),
        }
    }
}

impl FromStr for LrScaling {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(LrScaling::None),
            "linear" => Ok(LrScaling::Linear),
            "sqrt" => Ok(LrScaling::Sqrt),
            other => Err(format!("unknown LR scaling {other:?}: expected none, linear or sqrt")),
        }
    }
}

impl fmt::Display for LrScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LrScaling::None => "none",
            LrScaling::Linear => "linear",
            LrScaling::Sqrt => "sqrt",
        })
    }
}

/// The learning rate over the run, as a factor of the (scaled) peak rate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Schedule {
    /// The peak rate at every step.
    #[default]
    Constant,
    /// Linear warmup from 0 over `warmup` steps, then linear decay to 0 at
    /// `total` steps (transformers' `get_linear_schedule_with_warmup`).
    WarmupLinear {
        /// Warmup steps.
        warmup: u64,
        /// Total steps of the run.
        total: u64,
    },
}

impl Schedule {
    /// Warmup over `fraction` of `total` steps (rounded down, as transformers does).
    pub fn warmup_linear(fraction: f64, total: u64) -> Self {
        Schedule::WarmupLinear { warmup: (fraction * total as f64) as u64, total }
    }

    /// The rate of step `step` (0-based) for a peak rate of `peak`.
    pub fn lr(&self, peak: f64, step: u64) -> f64 {
        match *self {
            Schedule::Constant => peak,
            Schedule::WarmupLinear { warmup, total } => {
                if step < warmup {
                    return peak * step as f64 / warmup.max(1) as f64;
                }
                let left = total.saturating_sub(step) as f64;
                let span = total.saturating_sub(warmup).max(1) as f64;
                peak * (left / span).max(0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_follows_the_world_size() {
        assert_eq!(LrScaling::Linear.scale(5e-5, 4), 2e-4);
        assert_eq!(LrScaling::Sqrt.scale(5e-5, 4), 1e-4);
        assert_eq!(LrScaling::None.scale(5e-5, 4), 5e-5);
        assert_eq!("sqrt".parse::<LrScaling>(), Ok(LrScaling::Sqrt));
        assert!("cubic".parse::<LrScaling>().unwrap_err().contains("none, linear or sqrt"));
    }

    #[test]
    fn warmup_then_linear_decay_like_transformers() {
        let s = Schedule::warmup_linear(0.1, 100);
        assert_eq!(s, Schedule::WarmupLinear { warmup: 10, total: 100 });
        assert_eq!(s.lr(1.0, 0), 0.0);
        assert_eq!(s.lr(1.0, 5), 0.5);
        assert_eq!(s.lr(1.0, 10), 1.0);
        assert!((s.lr(1.0, 55) - 0.5).abs() < 1e-12);
        assert_eq!(s.lr(1.0, 100), 0.0);
        assert_eq!(s.lr(1.0, 150), 0.0);
        assert_eq!(Schedule::Constant.lr(2e-5, 7), 2e-5);
    }
}

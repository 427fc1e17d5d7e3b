//! Learning-rate scaling with the world size, and the warmup + linear decay
//! schedule of BERT fine-tuning.

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

/// Linear warmup from 0 to `peak` over `warmup` steps, then linear decay to 0 at
/// `total` steps (transformers' `get_linear_schedule_with_warmup`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupLinear {
    /// The rate at the end of warmup.
    pub peak: f64,
    /// Warmup steps.
    pub warmup: usize,
    /// Total steps.
    pub total: usize,
}

impl WarmupLinear {
    /// Warmup over `fraction` of `total` steps (rounded down, as transformers does).
    pub fn with_fraction(peak: f64, fraction: f64, total: usize) -> Self {
        WarmupLinear { peak, warmup: (fraction * total as f64) as usize, total }
    }

    /// The rate used for step `step` (0-based).
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.peak * step as f64 / self.warmup.max(1) as f64;
        }
        let left = self.total.saturating_sub(step) as f64;
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        self.peak * (left / span).max(0.0)
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
        let s = WarmupLinear::with_fraction(1.0, 0.1, 100);
        assert_eq!(s.warmup, 10);
        assert_eq!(s.lr(0), 0.0);
        assert_eq!(s.lr(5), 0.5);
        assert_eq!(s.lr(10), 1.0);
        assert!((s.lr(55) - 0.5).abs() < 1e-12);
        assert_eq!(s.lr(100), 0.0);
        assert_eq!(s.lr(150), 0.0);
    }
}

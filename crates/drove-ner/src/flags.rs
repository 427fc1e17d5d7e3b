//! The flags' value parsers (feature `clap`), with messages that name the
//! flag; `drove` parses its other flags with them too.

use drove_train::flat::AdamWSettings;

/// A count of at least `min`, named `what` in the error (`why` follows the bound).
pub fn at_least(s: &str, min: usize, what: &str, why: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|_| format!("{what} must be a whole number, found {s:?}"))?;
    if n >= min { Ok(n) } else { Err(format!("{what} must be at least {min}{why}, found {n}")) }
}

/// A finite number of at least `min` (NaN, infinities and values below
/// `min` are refused).
pub fn finite_at_least(s: &str, min: f64, flag: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|_| format!("{flag} must be a number, found {s:?}"))?;
    if x.is_finite() && x >= min {
        Ok(x)
    } else {
        Err(format!("{flag} must be a finite number of at least {min}, found {x}"))
    }
}

/// A fraction in [0, 1].
pub fn fraction(s: &str, flag: &str) -> Result<f64, String> {
    let x: f64 = s.trim().parse().map_err(|_| format!("{flag} must be a number in [0, 1], found {s:?}"))?;
    if (0.0..=1.0).contains(&x) { Ok(x) } else { Err(format!("{flag} must be in [0, 1], found {x}")) }
}

/// `--weight-decay`: AdamW's defaults with this decay.
pub fn weight_decay(s: &str) -> Result<AdamWSettings, String> {
    let weight_decay = finite_at_least(s, 0.0, "--weight-decay")?;
    Ok(AdamWSettings { weight_decay, ..AdamWSettings::default() })
}

//! Shared parsers for command-line values, with messages that name the
//! setting, and the coordinator flags' fallbacks.

use drove_collate::MaskSeeding;

/// A count of at least `min`, named `what` in the error.
pub use drove_ner::flags::at_least;

/// A mask probability: a number in [0, 1].
pub fn probability(s: &str) -> Result<f64, String> {
    drove_ner::flags::fraction(s, "probability")
}

/// A seeding policy, through [`MaskSeeding`]'s `FromStr`.
pub fn seeding(s: &str) -> Result<MaskSeeding, String> {
    s.parse()
}

/// A duration in seconds: finite and not negative.
pub fn seconds(s: &str) -> Result<f64, String> {
    drove_ner::flags::finite_at_least(s, 0.0, "seconds")
}

/// A byte size: a whole number with B, KiB, MiB or GiB (or none: bytes),
/// at least one f32 element.
pub use drove_bench::parse_bytes as bytes;

/// A timeout in seconds: finite and above 0.
pub fn positive_secs(s: &str) -> Result<f64, String> {
    let x = seconds(s)?;
    if x > 0.0 { Ok(x) } else { Err(format!("a timeout must be above 0 seconds, found {x}")) }
}

/// `token`, else `$DROVE_TOKEN` when set and not empty.
pub(crate) fn token_or_env(token: Option<&str>) -> Option<String> {
    token.map(str::to_string).or_else(drove_launch::token_from_env)
}

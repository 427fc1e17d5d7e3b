//! The value parsers the suites' flags share (feature `clap`), with messages
//! that name the flag; each suite keeps its own bounds beside its options.

use drove_collate::MaskSeeding;

/// A count of at least `min`, named `what` in the error.
pub(crate) use drove_ner::flags::at_least;

/// A duration in seconds: finite and not negative.
pub(crate) fn seconds(s: &str) -> Result<f64, String> {
    drove_ner::flags::finite_at_least(s, 0.0, "seconds")
}

/// A seeding policy, through [`MaskSeeding`]'s `FromStr`.
pub(crate) fn seeding(s: &str) -> Result<MaskSeeding, String> {
    s.parse()
}

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

/// What parsing no flags gives for the options `T` (a test holds it equal to
/// `T::default()`, so the library's defaults are the command's).
#[cfg(test)]
pub(crate) fn parsed_from_no_flags<T: clap::Args>() -> T {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Flags<T: clap::Args> {
        #[command(flatten)]
        options: T,
    }
    Flags::<T>::parse_from(["drove-bench"]).options
}

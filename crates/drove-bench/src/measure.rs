//! What every suite measures with: the median, and the spinner.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The median of `xs` (of an even count, the upper of the two middle
/// values), or `None` when there are none. NaNs sort last.
///
/// ```
/// assert_eq!(drove_bench::median(vec![3.0, 1.0, 2.0]), Some(2.0));
/// assert_eq!(drove_bench::median(vec![4.0, 1.0, 3.0, 2.0]), Some(3.0));
/// assert_eq!(drove_bench::median(Vec::new()), None);
/// ```
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied()
}

/// A spinner on stderr, `{spinner} {msg} ({elapsed})`, drawn when `show` and
/// stderr is a terminal; hidden otherwise (its messages cost nothing then).
pub(crate) fn spinner(show: bool) -> ProgressBar {
    let target = if show && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let pb = ProgressBar::with_draw_target(None, target);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

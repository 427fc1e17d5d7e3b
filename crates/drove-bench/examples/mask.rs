//! The mask suite from a program of one's own: half a second per
//! measurement, the loader with two workers, the report as JSON and as the
//! table `drove bench mask` prints.
//!
//! ```text
//! cargo run --release -p drove-bench --example mask
//! ```

use drove_bench::mask::{self, MaskOptions};

fn main() -> Result<(), drove_bench::BenchError> {
    let options = MaskOptions { seconds: 0.5, workers: Some(2), ..MaskOptions::default() };
    let report = mask::run(&options)?;
    println!("{}", serde_json::to_string_pretty(&report).expect("a report serialises"));
    print!("{report}");
    println!(
        "the masker runs at {:.3}x the rate of a plain copy of the same token ids",
        report.masker_vs_copy
    );
    Ok(())
}

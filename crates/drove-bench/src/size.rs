//! Byte sizes as people write them (`64MiB`) and read them.

use std::str::FromStr;

/// A byte size: a whole number with B, KiB, MiB or GiB (or none: bytes; K,
/// KB, M, MB, G and GB are the binary units too), at least one f32 element.
///
/// ```
/// assert_eq!(drove_bench::parse_bytes("64MiB"), Ok(64 << 20));
/// assert!(drove_bench::parse_bytes("2").unwrap_err().contains("below one f32 element"));
/// ```
pub fn parse_bytes(part: &str) -> Result<usize, String> {
    let part = part.trim();
    let digits = part.find(|c: char| !c.is_ascii_digit()).unwrap_or(part.len());
    let (num, unit) = part.split_at(digits);
    let n: usize = num.parse().map_err(|_| format!("size {part:?} must start with a whole number"))?;
    let mult: usize = match unit {
        "" | "B" => 1,
        "KiB" | "K" | "KB" => 1 << 10,
        "MiB" | "M" | "MB" => 1 << 20,
        "GiB" | "G" | "GB" => 1 << 30,
        other => return Err(format!("size {part:?}: unknown unit {other:?} (B, KiB, MiB or GiB)")),
    };
    let bytes = n.checked_mul(mult).ok_or_else(|| format!("size {part:?} is too large"))?;
    if bytes < 4 {
        return Err(format!("size {part:?} is below one f32 element"));
    }
    Ok(bytes)
}

/// `bytes` in the largest binary unit that divides it: `64MiB`, `1000B`.
pub fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

/// A list of byte sizes, written `1KiB,64MiB,...` (each as [`parse_bytes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizes(pub Vec<usize>);

impl FromStr for Sizes {
    type Err = String;

    fn from_str(s: &str) -> Result<Sizes, String> {
        s.split(',').map(parse_bytes).collect::<Result<Vec<_>, _>>().map(Sizes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units_and_print_in_the_largest() {
        assert_eq!("1KiB,64MiB,1G,12".parse(), Ok(Sizes(vec![1 << 10, 64 << 20, 1 << 30, 12])));
        assert!("12XB".parse::<Sizes>().unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("MiB").unwrap_err().contains("must start with a whole number"));
        assert_eq!(human(1 << 10), "1KiB");
        assert_eq!(human(3 << 30), "3GiB");
        assert_eq!(human(1000), "1000B");
    }
}

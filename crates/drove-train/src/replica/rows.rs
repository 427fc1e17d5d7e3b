//! The batch a [`Replica`](crate::Replica) splits by rows ([`Rows`]), one
//! micro-batch of it as the loss closure sees it ([`Micro`]), and the split
//! itself ([`split_rows`]).

use std::ops::Range;

/// A batch a replica can split by rows into micro-batches.
pub trait Rows: Sync {
    /// Rows (examples) in the batch.
    fn rows(&self) -> usize;
}

impl<T: Sync> Rows for [T] {
    fn rows(&self) -> usize {
        self.len()
    }
}

impl<T: Sync> Rows for Vec<T> {
    fn rows(&self) -> usize {
        self.len()
    }
}

/// One micro-batch, as the loss closure sees it.
#[derive(Debug)]
pub struct Micro<'a, T: ?Sized> {
    /// The whole batch passed to [`Replica::step`](crate::Replica::step).
    pub batch: &'a T,
    /// The rows of `batch` this micro-batch covers.
    pub rows: Range<usize>,
    /// Which micro-batch (0-based).
    pub index: usize,
    /// The factor the replica applies to the closure's loss (see
    /// [`LossReduction`](super::LossReduction)).
    pub weight: f64,
}

/// Splits `rows` into at most `parts` contiguous ranges of near-equal size (the
/// first ones one row larger), leaving out empty ones (the split
/// `drove-collate`'s `Batch::split` makes too).
pub fn split_rows(rows: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.clamp(1, rows.max(1));
    let (base, extra) = (rows / parts, rows % parts);
    let mut start = 0;
    let mut out = Vec::with_capacity(parts);
    for p in 0..parts {
        let len = base + usize::from(p < extra);
        if len > 0 {
            out.push(start..start + len);
        }
        start += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_as_the_collator_splits_batches() {
        assert_eq!(split_rows(16, 3), vec![0..6, 6..11, 11..16]);
        assert_eq!(split_rows(2, 4), vec![0..1, 1..2]);
        assert_eq!(split_rows(5, 1), vec![0..5]);
    }
}

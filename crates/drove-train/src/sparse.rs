//! [`SparseRows`]: which parameters' gradients cross the network as the rows
//! a batch touched (embedding tables), not whole.
//!
//! An embedding's gradient is zero but for the rows of the tokens in the
//! batch, and it is the last gradient backward finishes, so a dense
//! all-reduce of it is exposed in full after backward however the rest
//! overlaps. A matched table is all-reduced by
//! [`drove_collective::all_reduce_rows`]: the touched rows of every rank are
//! gathered and summed, or the table goes dense when they would be more than
//! it (the same choice on every rank). On one host the result is that of the
//! dense all-reduce bit for bit; over the TCP ring the sum's order differs.

use drove_collective::fusion::Layout;

use crate::flat::glob;

/// The default patterns of row-sparse parameters: any table whose name
/// mentions an embedding (drove-bert's `bert.embeddings.word.weight`, a
/// model's `embedding.weight`).
pub const SPARSE_ROWS: [&str; 1] = ["*embed*"];

/// Which parameters' gradients are all-reduced as their touched rows. Every
/// rank must use the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseRows {
    /// Parameters whose dotted names match one of these (`*` is any run of
    /// characters), and which are tables (two dimensions: rows by values).
    pub patterns: Vec<String>,
    /// Tables smaller than this many bytes ride in a bucket with the rest
    /// (a position embedding's few hundred rows are all touched anyway).
    pub min_bytes: usize,
}

impl Default for SparseRows {
    /// [`SPARSE_ROWS`], tables of 1 MiB and more.
    fn default() -> Self {
        SparseRows { patterns: SPARSE_ROWS.map(String::from).to_vec(), min_bytes: 1 << 20 }
    }
}

impl SparseRows {
    /// No parameter sent as rows: every gradient dense, in buckets.
    pub fn off() -> Self {
        SparseRows { patterns: Vec::new(), min_bytes: 0 }
    }

    /// How each parameter (dotted `names`, `shapes`, module order) is
    /// all-reduced: [`Layout::Rows`] for a matched table of `min_bytes` or
    /// more, [`Layout::Dense`] for the rest.
    pub fn layouts(&self, names: &[String], shapes: &[Vec<usize>]) -> Vec<Layout> {
        names
            .iter()
            .zip(shapes)
            .map(|(name, shape)| match shape.as_slice() {
                &[rows, row_len]
                    if rows * row_len * 4 >= self.min_bytes
                        && row_len > 0
                        && self.patterns.iter().any(|p| glob(p, name)) =>
                {
                    Layout::Rows { row_len }
                }
                _ => Layout::Dense,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_embedding_tables_are_rows_and_the_rest_dense() {
        let names: Vec<String> = [
            "bert.embeddings.word.weight",
            "bert.embeddings.position.weight",
            "bert.embeddings.norm.gamma",
            "bert.layers.0.query.weight",
        ]
        .map(String::from)
        .to_vec();
        let shapes = vec![vec![30522, 384], vec![512, 384], vec![384], vec![384, 384]];
        let rows = Layout::Rows { row_len: 384 };
        let dense = Layout::Dense;
        assert_eq!(SparseRows::default().layouts(&names, &shapes), vec![rows, dense, dense, dense]);
        let all = SparseRows { patterns: vec!["*".into()], min_bytes: 0 };
        assert_eq!(all.layouts(&names, &shapes), vec![rows, rows, dense, rows]);
        assert_eq!(SparseRows::off().layouts(&names, &shapes), vec![dense; 4]);
    }
}

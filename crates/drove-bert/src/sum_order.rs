//! [`SumOrder`]: how the model lays out the sums its backward computes (issue
//! 49, steps 2 and 5). Each choice gives the same gradients up to the order
//! of floating-point additions, and each is chosen for how it runs on a GPU:
//! the defaults are the layouts the model always had.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};

/// How a model's backward sums over tokens; the default is the model's
/// original layout. A choice of the step, not of the weights: it is no part
/// of a saved model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SumOrder {
    /// How dense layers' weight and bias gradients are summed over tokens.
    pub dense: DenseSums,
    /// How the embedding tables' gradients are summed.
    pub embeddings: EmbeddingSums,
}

/// How a dense layer over `[batch, seq, d]` sums its weight and bias
/// gradients over the `n = batch * seq` tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DenseSums {
    /// One GEMM over the flattened `[n, d]` rows: the weight gradient is one
    /// GEMM whose inner dimension is `n`, the bias gradient one sum over `n`
    /// rows (on burn-cubecl without autotune: one thread per output, each
    /// looping over every token).
    #[default]
    Plain,
    /// Split-K without a kernel of drove's own: the rows as `c` chunks,
    /// `[c, n / c, d]` times the weight broadcast to `[1, d, out]`, so that
    /// burn's broadcast backward computes the weight gradient as `c` batched
    /// GEMMs over `n / c` rows each, summed over the chunks; and the bias
    /// added on the `[batch, seq, out]` view, so its gradient is summed over
    /// the batch and then over the sequence. `c` is [`DenseSums::chunks`].
    SplitK {
        /// Rows a chunk should have at least: `c = n / rows_per_chunk`,
        /// within 1..=[`MAX_CHUNKS`], rounded down to a power of two that
        /// divides `n` ([`DEFAULT_ROWS_PER_CHUNK`] on GPUs).
        rows_per_chunk: usize,
    },
}

/// The most chunks [`DenseSums::SplitK`] splits a weight gradient into: 16
/// chunks of `[in, out]` partial sums is at most 9 MB for MiniLM's largest
/// layer, and 8-16 times the thread blocks of one GEMM fill a GPU.
pub const MAX_CHUNKS: usize = 16;

/// The rows per chunk of [`DenseSums::split_k`]: a chunk still long enough
/// for a GEMM's inner loop to amortise its start.
pub const DEFAULT_ROWS_PER_CHUNK: usize = 512;

impl DenseSums {
    /// [`DenseSums::SplitK`] with [`DEFAULT_ROWS_PER_CHUNK`].
    pub fn split_k() -> Self {
        DenseSums::SplitK { rows_per_chunk: DEFAULT_ROWS_PER_CHUNK }
    }

    /// Into how many chunks the `n` rows of a dense layer's input are split:
    /// 1 for [`DenseSums::Plain`]; for [`DenseSums::SplitK`],
    /// `n / rows_per_chunk` clamped to `1..=MAX_CHUNKS`, then the largest
    /// power of two not above it that divides `n` (1 when `n` is odd), so
    /// that no row is ever left out of a chunk.
    pub fn chunks(self, n: usize) -> usize {
        let DenseSums::SplitK { rows_per_chunk } = self else { return 1 };
        let wanted = (n / rows_per_chunk.max(1)).clamp(1, MAX_CHUNKS);
        let mut c = 1 << wanted.ilog2();
        while !n.is_multiple_of(c) {
            c /= 2;
        }
        c
    }
}

/// How the position and token-type embeddings are added, and how the three
/// tables' gradients (word, position, token type) are summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EmbeddingSums {
    /// A lookup (burn's `select`) of every token's position and type: the
    /// backward is burn's `select_assign`, which on burn-cubecl runs one
    /// thread per column, each walking every token.
    #[default]
    Select,
    /// The first `seq` rows of the position table sliced and broadcast over
    /// the batch (backward: a sum over the batch into those rows), and, when
    /// the input says every token type is 0 ([`TokenTypes::Zero`]), row 0 of
    /// the token-type table broadcast to every token (backward: a sum over
    /// all tokens into row 0). Types given as ids are still looked up. On
    /// backends with drove's kernels (the GPUs'), the word table is looked
    /// up through `drove_kernels::embedding::lookup`, whose gradient is
    /// drove's deterministic scatter (the batch's ids sorted on the device,
    /// each id's tokens added in ascending order, no atomics) rather than
    /// `select_assign`; elsewhere (the CPU) it is burn's lookup, as under
    /// [`EmbeddingSums::Select`].
    Sliced,
}

/// The token types (segment ids) of a batch.
#[derive(Clone, Debug)]
pub enum TokenTypes<B: Backend> {
    /// Every token is of type 0: a single segment, as HuggingFace's BERT
    /// assumes when no `token_type_ids` are given. Known by construction (no
    /// tensor is read), so [`EmbeddingSums::Sliced`] can broadcast row 0.
    Zero,
    /// Types `[batch, seq]`, looked up row by row.
    Ids(Tensor<B, 2, Int>),
}

impl<B: Backend> From<Tensor<B, 2, Int>> for TokenTypes<B> {
    fn from(ids: Tensor<B, 2, Int>) -> Self {
        TokenTypes::Ids(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_never_splits() {
        assert_eq!(DenseSums::Plain.chunks(1 << 20), 1);
    }

    #[test]
    fn split_k_takes_n_over_512_up_to_16_chunks() {
        let s = DenseSums::split_k();
        assert_eq!(s.chunks(511), 1);
        assert_eq!(s.chunks(1024), 2);
        assert_eq!(s.chunks(32 * 64), 4);
        assert_eq!(s.chunks(256 * 32), MAX_CHUNKS);
        assert_eq!(s.chunks(256 * 512), MAX_CHUNKS);
    }

    #[test]
    fn split_k_rounds_down_to_a_power_of_two() {
        // 12 chunks wanted, 8 taken: 6144 is a multiple of 8.
        assert_eq!(DenseSums::split_k().chunks(12 * 512), 8);
    }

    #[test]
    fn split_k_takes_a_divisor_or_one() {
        let s = DenseSums::SplitK { rows_per_chunk: 16 };
        assert_eq!(s.chunks(140), 4, "8 wanted; 140 = 4 * 35");
        assert_eq!(s.chunks(126), 2, "4 wanted; 126 = 2 * 63");
        assert_eq!(s.chunks(135), 1, "8 wanted; 135 is odd");
        assert_eq!(DenseSums::split_k().chunks(9 * 125), 1, "2 wanted; 1125 is odd");
    }

    #[test]
    fn split_k_survives_rows_per_chunk_0_and_no_rows() {
        assert_eq!(DenseSums::SplitK { rows_per_chunk: 0 }.chunks(64), MAX_CHUNKS);
        assert_eq!(DenseSums::split_k().chunks(0), 1);
    }
}

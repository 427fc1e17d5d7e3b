//! Gradient cosine: how alike the ranks' local gradients of one parameter are.
//!
//! Ranks that see different data (and different masks) get different local
//! gradients; ranks whose batches and augmentation coincide get the same one.
//! The cosine of every pair says which, beside the mask agreement.

use serde::Serialize;

/// Cosine similarity of two vectors, summed in `f64` (0 when either is zero).
pub fn cosine<T: Copy + Into<f64>>(a: &[T], b: &[T]) -> f64 {
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y): (f64, f64) = (x.into(), y.into());
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 { 0.0 } else { dot / (na.sqrt() * nb.sqrt()) }
}

/// The cosine of every pair of ranks' gradients.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GradCosine {
    /// Ranks compared.
    pub world_size: usize,
    /// Rank-by-rank cosine (1 on the diagonal, 0 for a zero gradient).
    pub matrix: Vec<Vec<f64>>,
    /// Mean over pairs of ranks (1 for a world of one).
    pub mean: f64,
}

impl GradCosine {
    /// Compares `grads[r]`, rank `r`'s local gradient, with every other rank's.
    #[allow(clippy::needless_range_loop)] // a symmetric matrix reads best indexed
    pub fn of<T: Copy + Into<f64>, G: AsRef<[T]>>(grads: &[G]) -> GradCosine {
        let w = grads.len();
        let mut matrix = vec![vec![0.0; w]; w];
        let (mut sum, mut pairs) = (0f64, 0usize);
        for a in 0..w {
            matrix[a][a] = cosine(grads[a].as_ref(), grads[a].as_ref());
            for b in a + 1..w {
                let c = cosine(grads[a].as_ref(), grads[b].as_ref());
                matrix[a][b] = c;
                matrix[b][a] = c;
                sum += c;
                pairs += 1;
            }
        }
        GradCosine { world_size: w, matrix, mean: if pairs == 0 { 1.0 } else { sum / pairs as f64 } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_of_parallel_orthogonal_opposite_and_zero_vectors() {
        assert!((cosine(&[1.0f32, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0f32, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert!((cosine(&[1.0f64, 2.0], &[-1.0, -2.0]) + 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[0.0f32, 0.0], &[1.0, 2.0]), 0.0);
    }

    #[test]
    fn the_matrix_is_symmetric_and_the_mean_is_over_pairs() {
        let g = GradCosine::of(&[vec![1.0f32, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]]);
        assert_eq!(g.world_size, 3);
        let half = std::f64::consts::FRAC_1_SQRT_2;
        assert!((g.matrix[0][2] - half).abs() < 1e-12 && g.matrix[2][0] == g.matrix[0][2]);
        assert!((g.mean - (0.0 + half + half) / 3.0).abs() < 1e-12, "{g:?}");
        assert_eq!(g.matrix[1][1], 1.0);
        assert_eq!(GradCosine::of::<f32, Vec<f32>>(&[vec![3.0]]).mean, 1.0);
    }
}

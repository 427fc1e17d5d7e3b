//! [`TokenMean`]: the one place that states how the fine-tune's loss is
//! reduced.
//!
//! The loss is the token cross-entropy over the labelled tokens of the
//! *global* batch, averaged: what one process training on every rank's batch
//! would minimise, whatever the ranks' shares of labelled tokens. Each rank
//! sums the cross-entropy over its own labelled tokens
//! ([`LossReduction::Sum`](drove_train::LossReduction::Sum)); the replica
//! averages the ranks' gradients (divides their sum by the world size). So a
//! rank's sum is multiplied by `world / labelled_global` ([`TokenMean::scale`]),
//! and the average of the ranks' scaled sums is the global token mean. What a
//! rank reports is its own token mean, the scale undone
//! ([`TokenMean::local_mean`]).

/// The reduction of one step's loss; see the [module](self).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TokenMean {
    world: usize,
    labelled_global: f64,
}

impl TokenMean {
    /// A step of `world` ranks whose batches hold `labelled_global` labelled
    /// tokens in all (at least one is counted, so a batch without labels
    /// scales by a finite factor).
    pub(crate) fn new(world: usize, labelled_global: f64) -> Self {
        TokenMean { world, labelled_global: labelled_global.max(1.0) }
    }

    /// What each rank's summed token loss is multiplied by.
    pub(crate) fn scale(&self) -> f64 {
        self.world as f64 / self.labelled_global
    }

    /// This rank's mean token loss, from its scaled sum (the replica's local
    /// loss) over its `local_labelled` labelled tokens.
    pub(crate) fn local_mean(&self, local_loss: f64, local_labelled: usize) -> f64 {
        local_loss * self.labelled_global / self.world as f64 / local_labelled.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::TokenMean;

    /// Two ranks, 3 and 5 labelled tokens: the ranks' scaled sums average to
    /// the mean over all 8 tokens, and each rank's own mean comes back.
    #[test]
    fn the_ranks_scaled_sums_average_to_the_global_token_mean() {
        let sums = [1.5_f64, 6.5];
        let mean = TokenMean::new(2, 8.0);
        let averaged = sums.iter().map(|s| s * mean.scale()).sum::<f64>() / 2.0;
        assert!((averaged - 8.0 / 8.0).abs() < 1e-12, "{averaged}");
        assert!((mean.local_mean(sums[0] * mean.scale(), 3) - 0.5).abs() < 1e-12);
        assert!((mean.local_mean(sums[1] * mean.scale(), 5) - 1.3).abs() < 1e-12);
        assert_eq!(TokenMean::new(4, 0.0).scale(), 4.0);
    }
}

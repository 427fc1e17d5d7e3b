//! Micro-batches: one rank's batch split by rows and run at once on threads
//! of their own.
//!
//! On a CPU, the backend runs only its matrix products on several threads;
//! the element-wise work between them (GELU, softmax, LayerNorm, copies) runs
//! on one. A rank that splits its batch into as many micro-batches as it has
//! cores, and runs each forward and backward pass on a one-thread pool,
//! keeps every core busy. The gradients are summed afterwards, so the step is
//! the one the whole batch would have taken, up to the order of the sums.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;
use rayon::prelude::*;

use crate::flat::PIECE;
use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};

/// Threads that each run one micro-batch of a step.
pub struct MicroBatches {
    /// One pool per micro-batch; empty when there is a single micro-batch,
    /// which runs on the caller's thread with the global pool.
    pools: Vec<ThreadPool>,
}

impl MicroBatches {
    /// How many micro-batches a batch of `batch_size` rows gets when asked
    /// for `requested` (0: one per thread of the global rayon pool), at most
    /// one per row.
    pub fn resolve(requested: usize, batch_size: usize) -> usize {
        let wanted = if requested == 0 { rayon::current_num_threads() } else { requested };
        wanted.min(batch_size).max(1)
    }

    /// `count` micro-batches sharing `threads` threads (each gets
    /// `threads / count`, at least one).
    pub fn new(count: usize, threads: usize) -> Result<Self, ThreadPoolBuildError> {
        let count = count.max(1);
        if count == 1 {
            return Ok(MicroBatches { pools: Vec::new() });
        }
        let each = (threads / count).max(1);
        let pools = (0..count)
            .map(|i| {
                ThreadPoolBuilder::new()
                    .num_threads(each)
                    .thread_name(move |_| format!("drove-micro-{i}"))
                    .build()
            })
            .collect::<Result<_, _>>()?;
        Ok(MicroBatches { pools })
    }

    /// The number of micro-batches a batch is split into.
    pub fn count(&self) -> usize {
        self.pools.len().max(1)
    }

    /// Runs `work` on every job at once, job `i` on pool `i`, and returns the
    /// results in job order. With one micro-batch (or one job) it runs on the
    /// calling thread.
    ///
    /// # Panics
    /// If there are more jobs than micro-batches, or a job panics.
    pub fn run<T, R, F>(&self, jobs: Vec<T>, work: F) -> Vec<R>
    where
        T: Send,
        R: Send,
        F: Fn(usize, T) -> R + Sync,
    {
        assert!(jobs.len() <= self.count(), "{} jobs for {} micro-batches", jobs.len(), self.count());
        if self.pools.is_empty() {
            return jobs.into_iter().enumerate().map(|(i, job)| work(i, job)).collect();
        }
        let work = &work;
        std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .into_iter()
                .enumerate()
                .map(|(i, job)| {
                    let pool = &self.pools[i];
                    scope.spawn(move || pool.install(|| work(i, job)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
        })
    }
}

/// A copy of `module` whose trainable parameters are new autodiff leaves over
/// the same data (no copy), keeping their ids.
///
/// Micro-batches run forward and backward on such copies: burn's autodiff
/// merges graphs that share a leaf into one, and two threads working on one
/// merged graph can deadlock inside burn-autodiff 0.21 (a backward pass holds
/// the graph and waits for the graph registry, while a merge holds the
/// registry and waits for the graph).
pub fn fresh_leaves<B: AutodiffBackend, M: Module<B>>(module: M) -> M {
    struct Fresh;
    impl<B: AutodiffBackend> ModuleMapper<B> for Fresh {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let trainable = tensor.is_require_grad();
            let leaf = tensor.detach();
            Param::from_mapped_value(id, if trainable { leaf.require_grad() } else { leaf }, mapper)
        }
    }
    module.map(&mut Fresh)
}

/// Adds every buffer of `other` into the matching one of `into`.
///
/// # Panics
/// If the buffers do not match in number or length.
pub fn add_into(into: &mut [Vec<f32>], other: &[Vec<f32>]) {
    assert_eq!(into.len(), other.len(), "gradient buffers to add differ in number");
    for (a, b) in into.iter().zip(other) {
        assert_eq!(a.len(), b.len(), "gradient buffers to add differ in length");
    }
    into.par_iter_mut()
        .zip(other)
        .flat_map(|(a, b)| a.par_chunks_mut(PIECE).zip(b.par_chunks(PIECE)))
        .for_each(|(a, b)| {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_on_their_own_one_thread_pools_and_come_back_in_order() {
        let micro = MicroBatches::new(3, 3).unwrap();
        assert_eq!(micro.count(), 3);
        let out = micro.run(vec![10, 20, 30], |i, job| {
            (i, job * 2, rayon::current_num_threads(), std::thread::current().name().map(String::from))
        });
        let expected: Vec<_> =
            (0..3).map(|i| (i, (i + 1) * 20, 1, Some(format!("drove-micro-{i}")))).collect();
        assert_eq!(out, expected);
    }

    #[test]
    fn one_micro_batch_runs_on_the_caller() {
        let micro = MicroBatches::new(1, 8).unwrap();
        let caller = std::thread::current().id();
        assert_eq!(micro.run(vec![()], |_, _| std::thread::current().id()), vec![caller]);
    }

    #[test]
    fn buffers_add_elementwise() {
        let mut a = vec![vec![1.0, 2.0], vec![3.0]];
        add_into(&mut a, &[vec![0.5, 0.5], vec![-3.0]]);
        assert_eq!(a, vec![vec![1.5, 2.5], vec![0.0]]);
    }
}

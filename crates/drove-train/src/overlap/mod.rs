//! The gradient all-reduce overlapped with backward, as Horovod, PyTorch DDP
//! and torchft do: each bucket is averaged across ranks as soon as backward
//! has finished its gradients, on an engine thread, and the step waits only
//! for what is left when backward ends.
//!
//! Three parts: `graph` puts a hook on each parameter in burn's autodiff
//! graph, at the level that makes it fire right after the layer that uses it
//! (measured once by probes); `engine` sums and reduces
//! the buckets; `Overlap` is the replica's state between steps, which says
//! what kind of pass each backward is.
//!
//! Which pass overlaps: with `backward_passes_per_step > 1` only the last
//! pass of a step does (the earlier ones only accumulate, as in the
//! non-overlapped step); with micro-batches, a bucket waits for every
//! micro-batch's gradients. The first backward pass of a replica is the
//! measuring pass and does not overlap. Overlap needs burn's `Autodiff`
//! backend without checkpointing (any inner backend), more than one rank,
//! and the host collective or host staging (an in-place device collective
//! reduces after backward, as before).

pub(crate) mod engine;
pub(crate) mod graph;

use burn::tensor::backend::Backend;

use graph::Ticks;

/// What kind of backward pass a replica runs next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PassKind {
    /// As without overlap: gradients taken after backward.
    Plain,
    /// Plain, with probes that measure where each gradient is finished.
    Measure,
    /// Hooks and the engine: buckets reduced during backward.
    Overlapped,
}

/// A replica's overlap state: the hook levels once measured, the ticks that
/// give them, and the local gradient kept for the diagnostic.
pub(crate) struct Overlap<I: Backend> {
    /// Hook level of each parameter (module order), once measured.
    levels: Option<Vec<Option<usize>>>,
    /// The ticks up to the deepest hook level.
    ticks: Option<Ticks<I>>,
    /// A parameter whose local (pre-average) gradient every overlapped pass
    /// keeps (`ReplicaOptions::keep_local_gradient`).
    pub keep_local: Option<usize>,
    /// The local gradient kept by the last overlapped pass.
    pub local: Option<(usize, Vec<f32>)>,
}

impl<I: Backend> Overlap<I> {
    /// Nothing measured yet; the overlapped passes keep the local gradient of
    /// parameter `keep_local`, if any.
    pub(crate) fn new(keep_local: Option<usize>) -> Self {
        Overlap { levels: None, ticks: None, keep_local, local: None }
    }

    /// The next pass's kind: `wanted` says whether overlap is on and can
    /// work here; `last` whether the pass ends the step.
    pub(crate) fn kind(&self, wanted: bool, last: bool) -> PassKind {
        match (wanted, &self.levels) {
            (false, _) => PassKind::Plain,
            (true, None) => PassKind::Measure,
            (true, Some(_)) if last => PassKind::Overlapped,
            (true, Some(_)) => PassKind::Plain,
        }
    }

    /// Takes what the probes of each micro-batch saw (see [`hook_levels`])
    /// and makes the ticks the hooks need.
    pub(crate) fn learn(&mut self, seen: Vec<Vec<Option<usize>>>, device: &I::Device) {
        let levels = hook_levels(&seen);
        let top = levels.iter().flatten().max().copied().unwrap_or(1);
        self.ticks = Some(Ticks::new(top, device));
        self.levels = Some(levels);
    }

    /// The hook levels and ticks (after [`learn`](Self::learn)).
    pub(crate) fn hooks(&self) -> Option<(&[Option<usize>], &Ticks<I>)> {
        Some((self.levels.as_deref()?, self.ticks.as_ref()?))
    }

    /// How many parameters are hooked (0 before measuring).
    pub(crate) fn hooked(&self) -> usize {
        self.levels.as_ref().map_or(0, |l| l.iter().flatten().count())
    }
}

/// The level of each parameter's hook from the deepest level at which each
/// micro-batch's probes saw its gradient (`seen[micro][param]`).
///
/// A gradient seen at level `l` was finished by a layer at level `l` or
/// deeper, so a hook at `l - 1` moves no layer (the shallowest over the
/// micro-batches is kept). A parameter that reaches its layer through a view
/// (LayerNorm's `gamma.unsqueeze()`, a transposed weight) has its gradient
/// only after the view's backward, near the end: it takes the level of the
/// parameter before it in module order (which a sequential model uses
/// earlier, so its layer is shallower) when that is deeper. Levels below 2
/// (the embeddings, whose gradients are finished last anyway) get no hook.
pub(crate) fn hook_levels(seen: &[Vec<Option<usize>>]) -> Vec<Option<usize>> {
    let Some(first) = seen.first() else { return Vec::new() };
    let mut previous = None;
    (0..first.len())
        .map(|k| {
            let own = seen
                .iter()
                .map(|m| m.get(k).copied().flatten())
                .min()
                .flatten()
                .and_then(|l| l.checked_sub(1));
            let level = own.max(previous);
            previous = level;
            level.filter(|&l| l >= 2)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::hook_levels;

    #[test]
    fn hooks_sit_one_level_above_the_gradient_and_views_inherit() {
        // An embedding (seen at 1), a linear layer (12), a LayerNorm through a
        // view (not seen), a classifier (20); two micro-batches, one of which
        // saw the linear layer one level later.
        let seen = vec![
            vec![Some(1), Some(12), None, None, Some(20)],
            vec![Some(1), Some(11), None, None, Some(20)],
        ];
        assert_eq!(hook_levels(&seen), vec![None, Some(10), Some(10), Some(10), Some(19)]);
        assert_eq!(hook_levels(&[]), Vec::<Option<usize>>::new());
    }
}

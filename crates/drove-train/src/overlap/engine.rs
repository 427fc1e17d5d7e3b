//! The engine: a thread that takes each parameter's finished gradient as
//! backward produces it, sums the micro-batches' (and earlier passes') in the
//! order the non-overlapped step sums them, and all-reduces each bucket as
//! soon as all of its gradients are in, while backward goes on.
//!
//! Buckets are those of the non-overlapped step (consecutive parameters in
//! module order, at most the fusion threshold each, and each row-sparse table
//! alone: drove-collective's `fusion::Plan`), so the values are the same bit
//! for bit. They are issued in one fixed order on every rank, the
//! last bucket first (backward finishes the last layers first); the engine
//! blocks on its inbox, never spins, and a bucket that is not whole yet waits
//! for its last gradient.

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use drove_collective::fusion;

use crate::TrainError;
use crate::gradients::HostBuckets;
use crate::timeline::{Timeline, Track};

/// What reaches the engine from the micro-batches' threads.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// Micro-batch `micro`'s backward pass started `at`.
    Backward {
        /// The micro-batch.
        micro: usize,
        /// When.
        at: Instant,
    },
    /// Parameter `param`'s gradient from micro-batch `micro`'s backward.
    Gradient {
        /// The parameter, in module order.
        param: usize,
        /// The micro-batch.
        micro: usize,
        /// Its values, row-major (or why they could not be read).
        values: Result<Vec<f32>, TrainError>,
        /// When backward handed it over.
        sent: Instant,
    },
    /// Micro-batch `micro` is done: every gradient it will send is sent; a
    /// parameter it sent none for has a zero gradient there.
    Done {
        /// The micro-batch.
        micro: usize,
    },
    /// Micro-batch `micro` stopped without finishing (it panicked).
    Failed {
        /// The micro-batch.
        micro: usize,
    },
}

/// What the engine needs to know before backward starts.
pub(crate) struct EngineRun<'a, 'c> {
    /// The buckets of the gradient all-reduce's door (the non-overlapped
    /// step's), which it reduces one by one.
    pub buckets: &'a HostBuckets<'c>,
    /// Elements of each parameter, in module order.
    pub sizes: Vec<usize>,
    /// Each parameter's hook level (empty when no parameter is hooked).
    pub levels: &'a [Option<usize>],
    /// Each parameter's dotted name, for the timeline.
    pub names: &'a [String],
    /// Micro-batches of this pass.
    pub micros: usize,
    /// Gradients summed over the step's earlier passes, if any.
    pub pending: Option<Vec<Vec<f32>>>,
    /// A parameter whose local sum is kept for [`Reduced::local`].
    pub keep_local: Option<usize>,
    /// Where bucket spans are drawn.
    pub timeline: &'a Timeline,
}

/// The engine's result: every parameter's averaged gradient.
pub(crate) struct Reduced {
    /// Averaged gradients, module order.
    pub grads: Vec<Vec<f32>>,
    /// The local sum of the parameter [`EngineRun::keep_local`] named.
    pub local: Option<(usize, Vec<f32>)>,
    /// Time the engine spent in all-reduces.
    pub communication: Duration,
}

/// Where each micro-batch's backward stands, for the timeline: since when
/// (its start, or the last hook level that handed over gradients) and which
/// level that was.
struct Levels<'a> {
    marks: Vec<Option<(Instant, Option<usize>)>>,
    plan_levels: &'a [Option<usize>],
    names: &'a [String],
}

impl Levels<'_> {
    /// A gradient of `param` from micro-batch `micro`, handed over `at`: the
    /// first of its hook level ends a span of backward on the micro-batch's
    /// track, named for the parameter's module (the layer whose backward it
    /// was).
    fn arrived(&mut self, param: usize, micro: usize, at: Instant, timeline: &Timeline) {
        if !timeline.is_on() {
            return;
        }
        let Some(level) = self.plan_levels.get(param).copied().flatten() else { return };
        let Some((since, last)) = self.marks[micro] else { return };
        if last == Some(level) {
            return;
        }
        let name = self.names.get(param).map_or("", String::as_str);
        let module = name.rsplit_once('.').map_or(name, |(module, _)| module);
        timeline.record_between(format!("backward {module}"), "level", Track::Micro(micro), since, at);
        self.marks[micro] = Some((at, Some(level)));
    }
}

/// Runs the engine on `inbox` until every bucket is reduced; see the
/// [module](self).
pub(crate) fn run(plan: EngineRun<'_, '_>, inbox: Receiver<Arrival>) -> Result<Reduced, TrainError> {
    let n = plan.sizes.len();
    let mut slots: Vec<Vec<Option<Vec<f32>>>> = vec![vec![None; plan.micros]; n];
    let mut sent: Vec<Option<Instant>> = vec![None; n];
    let mut done = vec![false; plan.micros];
    let mut pending = plan.pending.map(|p| p.into_iter().map(Some).collect::<Vec<_>>());
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); n];
    let mut local = None;
    let mut communication = Duration::ZERO;
    let mut levels = Levels { marks: vec![None; plan.micros], plan_levels: plan.levels, names: plan.names };
    let whole = |slots: &[Vec<Option<Vec<f32>>>], done: &[bool], k: usize| {
        slots[k].iter().zip(done).all(|(slot, &done)| slot.is_some() || done)
    };
    for (b, bucket) in plan.buckets.plan().buckets.iter().enumerate().rev() {
        let params = bucket.tensors();
        while !params.clone().all(|k| whole(&slots, &done, k)) {
            match inbox.recv() {
                Ok(Arrival::Backward { micro, at }) => levels.marks[micro] = Some((at, None)),
                Ok(Arrival::Gradient { param, micro, values, sent: at }) => {
                    levels.arrived(param, micro, at, plan.timeline);
                    let values = values?;
                    if values.len() != plan.sizes[param] {
                        let (found, expected) = (values.len(), plan.sizes[param]);
                        return Err(TrainError::GradientLength { param, found, expected });
                    }
                    slots[param][micro] = Some(values);
                    sent[param] = sent[param].max(Some(at));
                }
                Ok(Arrival::Done { micro }) => done[micro] = true,
                Ok(Arrival::Failed { micro }) => {
                    return Err(TrainError::MicroBatchFailed { micro });
                }
                Err(_) => return Err(TrainError::BucketIncomplete { bucket: b }),
            }
        }
        // The bucket was whole when backward handed over its last gradient.
        let ready = params.clone().filter_map(|k| sent[k]).max().unwrap_or_else(Instant::now);
        for k in params {
            // The order of the non-overlapped step: earlier passes, then each
            // micro-batch in turn, a missing gradient as zeros.
            let mut sum = pending.as_mut().and_then(|p| p[k].take());
            for slot in slots[k].iter_mut() {
                let g = slot.take().unwrap_or_else(|| vec![0.0; plan.sizes[k]]);
                sum = Some(match sum {
                    None => g,
                    Some(mut acc) => {
                        acc.iter_mut().zip(&g).for_each(|(a, x)| *a += x);
                        acc
                    }
                });
            }
            out[k] = sum.unwrap_or_else(|| vec![0.0; plan.sizes[k]]);
            if plan.keep_local == Some(k) {
                local = Some((k, out[k].clone()));
            }
        }
        let started = Instant::now();
        plan.buckets.average_bucket(b, &mut out)?;
        communication += started.elapsed();
        let what = match bucket {
            fusion::Bucket::Fused(_) => "all-reduce",
            fusion::Bucket::Rows { .. } => "rows all-gather",
        };
        plan.timeline.record(format!("gradients.bucket{b} {what}"), "bucket", Track::Engine, ready);
    }
    Ok(Reduced { grads: out, local, communication })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;

    use burn::backend::Flex;
    use drove_collective::fusion::{FusionOptions, all_reduce_fused};
    use drove_collective::{LocalWorld, ReduceOptions};

    use super::*;
    use crate::gradients::GradientAllReduce;

    /// Two ranks, two micro-batches, three parameters in two buckets; the
    /// gradients arrive last parameter first, one missing (zeros).
    #[test]
    fn the_engine_gives_the_fused_all_reduce_of_the_summed_gradients() {
        let world = LocalWorld::new(2).unwrap();
        let sizes = vec![3usize, 2, 4];
        let grad = |rank: usize, micro: usize, k: usize| -> Vec<f32> {
            (0..sizes[k]).map(|i| (rank * 7 + micro * 3 + k) as f32 * 0.1 + i as f32 * 1e-3).collect()
        };
        let fusion = FusionOptions { threshold_bytes: 20, ..FusionOptions::default() };
        let timeline = Timeline::off();
        // Per rank: (the fused all-reduce's gradients, the engine's).
        type Both = (Vec<Vec<f32>>, Vec<Vec<f32>>);
        let results: Vec<Both> = std::thread::scope(|s| {
            let handles: Vec<_> = world
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| {
                    let (sizes, timeline) = (&sizes, &timeline);
                    s.spawn(move || {
                        // The non-overlapped step: sums, then the fused all-reduce.
                        let mut expected: Vec<Vec<f32>> = (0..3)
                            .map(|k| {
                                let mut a = grad(rank, 0, k);
                                let b = if k == 1 { vec![0.0; sizes[k]] } else { grad(rank, 1, k) };
                                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                                a
                            })
                            .collect();
                        let mut refs: Vec<&mut [f32]> = expected.iter_mut().map(Vec::as_mut_slice).collect();
                        all_reduce_fused(&comm, "gradients", &mut refs, ReduceOptions::average(), fusion)
                            .unwrap();
                        let (tx, rx) = channel();
                        for (param, micro) in [(2, 1), (2, 0), (1, 0), (0, 1), (0, 0)] {
                            let values = Ok(grad(rank, micro, param));
                            tx.send(Arrival::Gradient { param, micro, values, sent: Instant::now() })
                                .unwrap();
                        }
                        tx.send(Arrival::Done { micro: 1 }).unwrap();
                        tx.send(Arrival::Done { micro: 0 }).unwrap();
                        let buckets = fusion::Plan::dense(&[12, 8, 16], fusion.threshold_bytes);
                        let all_reduce = GradientAllReduce::<Flex>::new(&comm, buckets, fusion.compression);
                        let plan = EngineRun {
                            buckets: all_reduce.host(),
                            sizes: sizes.clone(),
                            levels: &[],
                            names: &[],
                            micros: 2,
                            pending: None,
                            keep_local: None,
                            timeline,
                        };
                        (run(plan, rx).unwrap().grads, expected)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (got, expected) in results {
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn a_micro_batch_that_fails_stops_the_engine_with_an_error() {
        let (tx, rx) = channel();
        tx.send(Arrival::Failed { micro: 0 }).unwrap();
        let timeline = Timeline::off();
        let comm = drove_collective::SingleProcess;
        let buckets = fusion::Plan::dense(&[8], 1 << 20);
        let all_reduce = GradientAllReduce::<Flex>::new(&comm, buckets, Default::default());
        let plan = EngineRun {
            buckets: all_reduce.host(),
            sizes: vec![2],
            levels: &[],
            names: &[],
            micros: 1,
            pending: None,
            keep_local: None,
            timeline: &timeline,
        };
        let err = run(plan, rx).err().expect("an error");
        assert!(err.to_string().contains("micro-batch 0 stopped"), "{err}");
    }
}

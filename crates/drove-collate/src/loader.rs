//! A pool of loader threads producing batches ahead of the trainer, in order.
//!
//! As in PyTorch's `DataLoader`, batch `b` of an epoch is built by worker
//! `b mod W` and the consumer takes batches round-robin from the workers, so the
//! order is deterministic whatever the threads' timing. Unlike the story's loader,
//! worker `w` on rank `r` masks with its own stream: per sample
//! ([`MaskSeeding::PerSample`], the default), or per (rank, worker, epoch)
//! ([`MaskSeeding::PerWorker`]). The bug is there only when asked for by name
//! ([`MaskSeeding::Naive`]).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use drove_seed::{AugmentKey, Pcg64, Purpose, SampleStreams, StreamKey};

use crate::batch::{Batch, Bucketing, CollateError, Collator, Example, MaskSource, make_batches};
use crate::sampler::DistributedSampler;

/// Where the masker's random numbers come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum MaskSeeding {
    /// One counter-based stream per (seed, epoch, global sample index): masks do
    /// not depend on the number of ranks or workers. The default.
    #[default]
    PerSample,
    /// One sequential stream per (seed, rank, worker, epoch), for augmentation code
    /// that consumes a stream.
    PerWorker,
    /// **The bug**: one stream copied to every rank, worker and epoch, as when
    /// `random.seed(42)` runs in each process before the workers fork.
    Naive,
}

impl MaskSeeding {
    /// The name used on command lines.
    pub fn name(self) -> &'static str {
        match self {
            MaskSeeding::PerSample => "derived",
            MaskSeeding::PerWorker => "per-worker",
            MaskSeeding::Naive => "naive",
        }
    }
}

impl fmt::Display for MaskSeeding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for MaskSeeding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "derived" | "per-sample" => Ok(MaskSeeding::PerSample),
            "per-worker" | "worker" => Ok(MaskSeeding::PerWorker),
            "naive" => Ok(MaskSeeding::Naive),
            other => {
                Err(format!("unknown seeding {other:?}: expected derived (per-sample), per-worker or naive"))
            }
        }
    }
}

/// Loader settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderConfig {
    /// Rows per batch on this rank.
    pub batch_size: usize,
    /// Loader threads (at least 1).
    pub workers: usize,
    /// Batches each worker may build ahead of the consumer.
    pub prefetch: usize,
    /// Drop a last batch shorter than `batch_size`.
    pub drop_last: bool,
    /// Optional length bucketing.
    pub bucketing: Option<Bucketing>,
    /// Mask stream policy.
    pub seeding: MaskSeeding,
    /// Base seed of the augmentation streams.
    pub seed: u64,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 32,
            workers: 2,
            prefetch: 2,
            drop_last: false,
            bucketing: None,
            seeding: MaskSeeding::PerSample,
            seed: 42,
        }
    }
}

/// A loader that cannot be built or a batch that could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// Invalid settings.
    #[error("invalid loader config: {0}")]
    Config(String),
    /// A batch could not be collated.
    #[error("batch {batch}: {source}")]
    Collate {
        /// Batch number in the epoch.
        batch: usize,
        /// The cause.
        source: CollateError,
    },
    /// A worker thread ended without producing its batch (it panicked).
    #[error("loader worker {worker} died before producing batch {batch}")]
    WorkerDied {
        /// The worker.
        worker: usize,
        /// Batch number in the epoch.
        batch: usize,
    },
}

/// One rank's data loader.
#[derive(Clone, Debug)]
pub struct Loader {
    data: Arc<[Example]>,
    sampler: DistributedSampler,
    collator: Arc<Collator>,
    config: LoaderConfig,
}

impl Loader {
    /// A loader over `data` for the rank of `sampler`.
    pub fn new(
        data: Arc<[Example]>,
        sampler: DistributedSampler,
        collator: Arc<Collator>,
        config: LoaderConfig,
    ) -> Result<Self, LoaderError> {
        if config.workers == 0 {
            return Err(LoaderError::Config("workers must be at least 1".into()));
        }
        if config.batch_size == 0 {
            return Err(LoaderError::Config("batch_size must be at least 1".into()));
        }
        Ok(Loader {
            data,
            sampler,
            collator,
            config: LoaderConfig { prefetch: config.prefetch.max(1), ..config },
        })
    }

    /// The settings.
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// The sampler.
    pub fn sampler(&self) -> &DistributedSampler {
        &self.sampler
    }

    /// The batches (as global sample indices) of an epoch on this rank.
    pub fn plan(&self, epoch: u64) -> Vec<Vec<usize>> {
        let mut sampler = self.sampler.clone();
        sampler.set_epoch(epoch);
        let data = &self.data;
        make_batches(
            &sampler.indices(),
            |i| data[i].len(),
            self.config.batch_size,
            self.config.drop_last,
            self.config.bucketing,
            sampler.seed(),
            epoch,
        )
    }

    /// The stream key each worker masks with in `epoch` (for per-sample seeding,
    /// the key of the per-sample family), to log and replay.
    pub fn stream_keys(&self, epoch: u64) -> Vec<StreamKey> {
        (0..self.config.workers)
            .map(|w| match self.config.seeding {
                MaskSeeding::PerSample => SampleStreams::new(self.config.seed, Purpose::Augment, epoch).key(),
                MaskSeeding::PerWorker => StreamKey::augment(AugmentKey {
                    seed: self.config.seed,
                    rank: self.sampler.rank() as u32,
                    worker: w as u32,
                    epoch,
                }),
                MaskSeeding::Naive => StreamKey::naive(self.config.seed),
            })
            .collect()
    }

    /// Starts the workers for `epoch`; iterate to receive its batches in order.
    pub fn epoch(&self, epoch: u64) -> Epoch {
        let plan: Arc<[Vec<usize>]> = self.plan(epoch).into();
        let workers = self.config.workers;
        let mut receivers = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for (w, key) in self.stream_keys(epoch).into_iter().enumerate() {
            let (tx, rx) = sync_channel(self.config.prefetch);
            receivers.push(rx);
            let job = WorkerJob {
                worker: w,
                workers,
                plan: Arc::clone(&plan),
                data: Arc::clone(&self.data),
                collator: Arc::clone(&self.collator),
                seeding: self.config.seeding,
                seed: self.config.seed,
                epoch,
                key,
            };
            let handle = std::thread::Builder::new()
                .name(format!("drove-loader-{w}"))
                .spawn(move || job.run(tx))
                .expect("spawning a loader thread");
            handles.push(handle);
        }
        Epoch { receivers, handles, next: 0, total: plan.len() }
    }
}

struct WorkerJob {
    worker: usize,
    workers: usize,
    plan: Arc<[Vec<usize>]>,
    data: Arc<[Example]>,
    collator: Arc<Collator>,
    seeding: MaskSeeding,
    seed: u64,
    epoch: u64,
    key: StreamKey,
}

impl WorkerJob {
    fn run(self, tx: SyncSender<Result<Batch, CollateError>>) {
        let per_sample = SampleStreams::new(self.seed, Purpose::Augment, self.epoch);
        let mut sequential: Pcg64 = self.key.pcg64();
        for b in (self.worker..self.plan.len()).step_by(self.workers) {
            let indices = &self.plan[b];
            let examples: Vec<&Example> = indices.iter().map(|&i| &self.data[i]).collect();
            let source = match self.seeding {
                MaskSeeding::PerSample => MaskSource::PerSample(&per_sample),
                MaskSeeding::PerWorker | MaskSeeding::Naive => MaskSource::Sequential(&mut sequential),
            };
            let result = self.collator.collate(&examples, indices, source);
            if tx.send(result).is_err() {
                return; // the consumer is gone
            }
        }
    }
}

/// The batches of one epoch, in order. Dropping it stops the workers.
pub struct Epoch {
    receivers: Vec<Receiver<Result<Batch, CollateError>>>,
    handles: Vec<JoinHandle<()>>,
    next: usize,
    total: usize,
}

impl Epoch {
    /// Number of batches in the epoch.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether the epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

impl Iterator for Epoch {
    type Item = Result<Batch, LoaderError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        let batch = self.next;
        let worker = batch % self.receivers.len();
        self.next += 1;
        Some(match self.receivers[worker].recv() {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(source)) => Err(LoaderError::Collate { batch, source }),
            Err(_) => {
                self.next = self.total;
                Err(LoaderError::WorkerDied { worker, batch })
            }
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.total - self.next;
        (left, Some(left))
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.receivers.clear(); // unblocks workers waiting to send
        for handle in self.handles.drain(..) {
            let _ = handle.join();
        }
    }
}

//! [`ElasticRun`]: an elastic run in memory.

use std::collections::HashMap;
use std::time::Instant;

use tokio::sync::watch;

use super::keys::Keys;
use crate::generations::Generations;

/// An elastic run in memory: its generations, the watch channel its waiting
/// joins follow, its keys.
pub(super) struct ElasticRun {
    pub(super) gens: Generations,
    pub(super) changed: watch::Sender<u64>,
    pub(super) keys: Keys,
    /// Join calls waiting, per member: a timed-out join withdraws its member
    /// only if no other call of it (a client's retry) still waits.
    pub(super) waiting: HashMap<String, usize>,
}

impl ElasticRun {
    pub(super) fn new(run_id: &str, min: usize, max: usize) -> ElasticRun {
        ElasticRun {
            gens: Generations::new(run_id, min, max),
            changed: watch::channel(0).0,
            keys: Keys::default(),
            waiting: HashMap::new(),
        }
    }

    /// A run a restarted coordinator found in the store.
    pub(super) fn resume(
        run_id: &str,
        min: usize,
        max: usize,
        generations: Vec<crate::generations::Generation>,
    ) -> ElasticRun {
        let gens = Generations::resume(run_id, min, max, generations, Instant::now());
        ElasticRun { gens, ..ElasticRun::new(run_id, min, max) }
    }
}

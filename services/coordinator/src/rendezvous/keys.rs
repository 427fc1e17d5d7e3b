//! A run's key-value slot (e.g. the NCCL unique id).

use std::collections::HashMap;

use tokio::sync::watch;

/// A run's key-value slot (e.g. the NCCL unique id), and its change counter
/// that waiting readers watch.
pub(super) struct Keys {
    pub(super) values: HashMap<String, Vec<u8>>,
    pub(super) changed: watch::Sender<u64>,
}

impl Default for Keys {
    fn default() -> Keys {
        Keys { values: HashMap::new(), changed: watch::channel(0).0 }
    }
}

//! A communicator's settings: [`Transport`] and [`CommOptions`].

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Deadlines;
use crate::liveness::{DEFAULT_HANG_LIMIT, Liveness};

/// Which transport carries the data. A host is a kernel and a network
/// namespace (or [`CommOptions::host_id`], where set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory when every rank is on one host; the hierarchical
    /// all-reduce when some ranks share a host and others do not; the TCP
    /// ring when no two do (or shared memory cannot be set up).
    Auto,
    /// Always the flat TCP ring.
    Tcp,
    /// As `Auto`, but a world of several hosts that cannot set up shared
    /// memory on each fails to connect, naming the ranks, instead of falling
    /// back to the ring (a world on one host falls back as with `Auto`).
    Hierarchical,
}

impl Transport {
    /// The setting's name, as [`FromStr`](std::str::FromStr) takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Tcp => "tcp",
            Transport::Hierarchical => "hierarchical",
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" | "shm" => Ok(Transport::Auto),
            "tcp" | "flat" => Ok(Transport::Tcp),
            "hierarchical" => Ok(Transport::Hierarchical),
            other => Err(format!("unknown transport {other:?}: expected auto, tcp or hierarchical")),
        }
    }
}

/// Communicator settings.
#[derive(Clone, Debug)]
pub struct CommOptions {
    /// An op that has not completed after this long fails, naming the ranks it
    /// waits for (default 30 s).
    pub timeout: Duration,
    /// A warning names the ranks waited for after this long (default 10 s).
    pub warn_after: Duration,
    /// Time allowed to find and connect to every peer (default 60 s).
    pub connect_timeout: Duration,
    /// Data transport.
    pub transport: Transport,
    /// Bytes per shared-memory staging buffer (default 1 MiB).
    pub shm_chunk: usize,
    /// Which peers that keep an op waiting past `timeout` show no sign of
    /// life (an elastic run's heartbeats): those fail the op at the deadline,
    /// live ones are waited for up to `hang_limit`. `None` (the default):
    /// the deadline is final.
    pub liveness: Option<Arc<dyn Liveness>>,
    /// How long an op waits for peers that are alive (see `liveness`) before
    /// it fails naming them (default 10 minutes).
    pub hang_limit: Duration,
    /// This process's host identity, where given (drove-launch reads
    /// `DROVE_HOST_ID`): ranks with equal ids share memory. `None` (the
    /// default): the kernel's boot id and the network namespace.
    pub host_id: Option<String>,
    /// Test hook: the process kills itself (SIGKILL) after moving this many bytes.
    #[doc(hidden)]
    pub fault_kill_after_bytes: Option<u64>,
}

impl CommOptions {
    pub(crate) fn deadlines(&self) -> Deadlines {
        Deadlines {
            timeout: self.timeout,
            warn_after: self.warn_after,
            liveness: self.liveness.clone(),
            hang_limit: self.hang_limit.max(self.timeout),
        }
    }
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            timeout: Duration::from_secs(30),
            warn_after: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(60),
            transport: Transport::Auto,
            shm_chunk: 1 << 20,
            liveness: None,
            hang_limit: DEFAULT_HANG_LIMIT,
            host_id: None,
            fault_kill_after_bytes: None,
        }
    }
}

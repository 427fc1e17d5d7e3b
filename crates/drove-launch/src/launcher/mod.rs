//! The launcher side of the launch contract: [`launch`](crate::launch) starts the ranks of a
//! world on this host, tells each its place, relays their lines, supervises
//! them (a failed rank stops the world; a [`RestartPolicy`](crate::RestartPolicy) starts it again;
//! an elastic launch's slots start again alone), and serves or names their
//! coordinator.

pub(crate) mod child;
pub(crate) mod console;
pub(crate) mod coordinator;
pub(crate) mod launch;
pub(crate) mod relay;
pub(crate) mod restart;
pub(crate) mod signals;
pub(crate) mod spawn;
pub(crate) mod supervise;
pub(crate) mod watch;

//! # drove-comm: collectives that check their arguments and never hang
//!
//! The data plane of a data-parallel job: drove-collective's trait,
//! [`Collective`](drove_collective::Collective), with all-reduce (sum, average, min, max, product, with
//! pre- and post-scaling), broadcast from any root, all-gather with per-rank
//! first dimensions, reduce-scatter and barrier, for f32, f64, f16, bf16, i32
//! and i64, implemented on the CPU. A trainer
//! talks to its transport only through this trait; this crate knows nothing of
//! models.
//!
//! The CPU backend, [`Communicator`], connects every pair of ranks over TCP. When
//! all ranks share a host it moves data through a shared-memory region (chunks
//! staged, reduced by their owner and copied back, double-buffered) which is
//! what beats a socket-based ring on one machine; across hosts it runs a ring
//! reduce-scatter + all-gather over TCP whose sends, receives and reductions
//! overlap; and where some ranks share a host and others do not, the
//! all-reduce is hierarchical: shared memory within each host, the ring among
//! one leader per host. A host is a kernel and a network namespace
//! ([`CommOptions::host_id`] overrides it); [`Transport`] forces a choice. Two
//! decisions shape it:
//!
//! - **Agreement before data.** Every op starts with every rank sending its
//!   description (name, dtype, shape, op, scale factors, root) to every other. All
//!   ranks check the same list, so they all fail together, with the same message
//!   naming the field and the ranks; no data has moved and the next op works.
//! - **Deadlines everywhere.** Every wait watches all peer connections: a rank
//!   that dies is named as soon as its sockets close; one that stalls is named
//!   in a warning, then in an error when the deadline (30 s by default) passes.
//!
//! This crate reads no environment: a rendezvous and [`CommOptions`] are
//! given to [`Communicator::connect`]. Under a launcher, drove-launch builds
//! both from the launch contract (`drove_launch::connect_from_env()`). The
//! seam it implements is imported from drove-collective, one path whatever
//! the transport (as ripgrep's searcher names `grep_matcher::Matcher`, not
//! a regex engine's copy of it).
//!
//! ```no_run
//! use drove_collective::{Collective, CommError, Element, Place, ReduceOptions};
//! use drove_comm::{CommOptions, Communicator, FileRendezvous};
//!
//! // Rank 0 of 2, meeting the other in a folder both can see.
//! let rendezvous = FileRendezvous::new("/tmp/drove-rendezvous", Place::new(0, 2)?);
//! let comm = Communicator::connect(&rendezvous, CommOptions::default())?;
//! let mut grad = vec![comm.rank() as f32; 1024];
//! comm.all_reduce("grad", &[1024], f32::tensor_mut(&mut grad), ReduceOptions::average())?;
//! # Ok::<(), CommError>(())
//! ```
#![deny(missing_docs)]

mod clock;
mod comm;
mod engine;
mod greeting;
mod hierarchical;
mod host_id;
mod hosts;
mod liveness;
mod mesh;
mod options;
mod profile;
mod reduction;
mod rendezvous;
mod ring;
mod shm;
mod staged;

pub use comm::Communicator;
pub use liveness::{DEFAULT_HANG_LIMIT, Liveness};
pub use options::{CommOptions, Transport};
pub use profile::RingStep;
pub use rendezvous::{FileRendezvous, PeerTable, RankRequest, Rendezvous, StaticRendezvous, parse_peers};

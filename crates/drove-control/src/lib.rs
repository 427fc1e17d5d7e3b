//! # drove-control: the client side of the control plane
//!
//! Ranks talk to a drove coordinator for three things: finding each other
//! (a rendezvous that hands out ranks and the peer table), saying they are
//! alive (heartbeats, so a stopped rank is noticed), and, in an elastic run,
//! forming each generation's world. This crate is that client, and the only
//! one: [`CoordinatorRendezvous`] (a drove-comm `Rendezvous` through a
//! coordinator, with heartbeats once joined) and [`ElasticComm`] (the
//! membership client: drove-collective's `Elastic`, each world a drove-comm
//! `Communicator`, re-formed through the coordinator's generations, its
//! peers' heartbeats telling a slow member from a lost one).
//!
//! Every call runs on one async runtime ([`runtime`]), started at the first
//! call, whatever thread makes it; the heartbeats are tasks on it. The
//! crate reads no environment (drove-launch turns the launch contract's
//! variables into these types), spawns no process and knows no model.
//!
//! ```no_run
//! use drove_collective::Collective;
//! use drove_collective::Place;
//! use drove_comm::{CommOptions, Communicator, RankRequest};
//! use drove_control::CoordinatorRendezvous;
//!
//! // Rank 0 of 2 of run "exp1" on the coordinator at 10.0.0.1:50051.
//! let request = RankRequest::Given(Place::new(0, 2)?);
//! let rendezvous = CoordinatorRendezvous::new("10.0.0.1:50051", "exp1", request, None)?;
//! let comm = Communicator::connect(&rendezvous, CommOptions::default())?;
//! assert_eq!(comm.world_size(), 2);
//! # Ok::<(), drove_collective::CommError>(())
//! ```
#![deny(missing_docs)]

mod connect;
mod heartbeat;
pub mod launcher;
mod membership;
pub mod queries;
mod rendezvous;
pub mod runtime;
mod wire;

pub use connect::{Authed, Clients, ConnectError, Connection, MAX_MESSAGE_BYTES, Token, endpoint};
/// The proto messages the queries return, and the metric and event names.
pub use drove_proto as proto;
pub use heartbeat::DEFAULT_HEARTBEAT;
pub use membership::{
    DEFAULT_RENDEZVOUS_TIMEOUT, DEFAULT_SETTLE, ElasticComm, Membership, SILENT_AFTER_BEATS,
};
pub use queries::{ChunkStream, PointStream, QueryError, ServingStatus};
pub use rendezvous::CoordinatorRendezvous;

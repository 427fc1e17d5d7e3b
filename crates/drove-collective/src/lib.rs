//! # drove-collective: the seam between a trainer and its transport
//!
//! A data-parallel trainer needs a handful of collectives (all-reduce,
//! broadcast, all-gather, reduce-scatter, barrier) and nothing else of the
//! network. This crate is that seam and only that. Its root is what a caller
//! of a collective needs: the [`Collective`] trait, the [`Elastic`] trait of
//! a world that can end and re-form, the small types their ops take
//! ([`DType`], [`TensorMut`], [`ReduceOptions`], [`OpDesc`]), their errors
//! ([`CommError`]), ranks and world sizes checked once ([`Rank`],
//! [`WorldSize`], [`Place`]), gradient [`fusion`] and the row-sparse
//! all-reduce of embeddings ([`all_reduce_rows`]), two worlds that need no
//! transport: [`SingleProcess`] and [`LocalWorld`] (ranks as threads of one
//! process, for tests), and [`fault`], a collective that loses its rank at a
//! named op, for tests of a rank lost mid-step. What an implementation of
//! the trait is built from (the agreement check, the reduction kernels,
//! [`Delegate`](transport::Delegate)) is in [`transport`]. Programs import the
//! seam from here, whatever transport they open. It has no sockets, no
//! environment, no async runtime and no gRPC, so a trainer that depends on
//! it (drove-train) cannot reach a transport, and a transport (drove-comm's
//! CPU communicator, drove-nccl on GPUs) can be swapped under it, as
//! ripgrep's `Matcher` trait sits between its searcher and its regex engines.
//!
//! One decision shapes every implementation: **agreement before data**.
//! Every op starts with every rank's [`OpDesc`] reaching every other, and
//! every rank checks the same list ([`transport::agree`]), so a mismatch (another
//! shape, dtype, root, a skipped op) fails every rank alike, naming the
//! field and the ranks, before any data moved. A transport that moves its
//! data elsewhere runs that round alone first ([`Collective::agree`]).
//!
//! ```
//! use drove_collective::{Collective, Element, LocalWorld, ReduceOptions};
//!
//! let ranks = LocalWorld::new(3)?;
//! let sums = std::thread::scope(|s| {
//!     let handles: Vec<_> = ranks
//!         .iter()
//!         .map(|comm| {
//!             s.spawn(move || {
//!                 let mut grad = vec![comm.rank() as f32; 4];
//!                 comm.all_reduce("grad", &[4], f32::tensor_mut(&mut grad), ReduceOptions::sum())?;
//!                 Ok::<_, drove_collective::CommError>(grad[0])
//!             })
//!         })
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
//! })?;
//! assert_eq!(sums, [3.0, 3.0, 3.0]);
//! # Ok::<(), drove_collective::CommError>(())
//! ```
#![deny(missing_docs)]

mod collective;
mod dtype;
mod elastic;
mod error;
pub mod fault;
pub mod fusion;
mod local;
mod op;
mod place;
mod rows;
mod single;
pub mod transport;

// The seam: the traits and what their callers hand them and get back.
pub use collective::{Collective, Gathered, Pending};
pub use dtype::{Buffer, DType, Element, ReduceOp, TensorMut, TensorRef};
pub use elastic::{Elastic, Loss, MemberId, ReformCause, World, WorldRange};
pub use error::CommError;
pub use half::{bf16, f16};
pub use op::{OpDesc, OpKind, ReduceOptions};
pub use place::{Place, PlaceError, Rank, WorldSize};
pub use rows::{RowsSent, all_reduce_rows};
// Worlds that need no transport.
pub use local::{DEFAULT_LOCAL_TIMEOUT, LocalWorld};
pub use single::SingleProcess;

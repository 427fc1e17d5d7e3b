//! What an implementation of [`Collective`](crate::Collective) is built
//! from, beside the seam a caller uses: the agreement check every op starts
//! with ([`agree`], and the problems a rank finds in its own arguments,
//! [`shape_problem`] and [`scale_problem`]), the reduction kernels on raw
//! bytes ([`reduce`]), so that every transport checks and reduces alike, and
//! [`Delegate`], a collective that hands every op to another one (a wrapper,
//! an elastic member's current world).
//!
//! A trainer needs none of these: it calls a [`Collective`](crate::Collective).
//! drove-comm's communicator, drove-nccl's device collectives, drove-control's
//! elastic member and [`LocalWorld`](crate::LocalWorld) are built from them.

mod agree;
mod delegate;
pub mod reduce;

pub use agree::{agree, scale_problem, shape_problem};
pub use delegate::{Call, CallMode, Delegate};

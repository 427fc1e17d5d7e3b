//! # drove-kernels: drove's own work on the device
//!
//! What a training step asks of a GPU beyond burn's operations, and how much
//! it asks: [`transfer`] counts the blocking reads (the host waiting for the
//! device) and the uploads a step makes, at drove's own call sites, so that a
//! benchmark can report them per step and a test can hold them.
//!
//! The counters are process-wide and cost one relaxed atomic add a call; the
//! wrappers [`transfer::read`], [`transfer::read_scalar`] and
//! [`transfer::upload`] are what drove's crates call instead of burn's
//! `into_data`, `into_scalar` and `from_data` on tensors of the training
//! device.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Tensor, TensorData};
//! use drove_kernels::transfer;
//!
//! let before = transfer::transfers();
//! let t: Tensor<Flex, 1> = transfer::upload(TensorData::new(vec![1.0f32, 2.0], [2]), &Default::default());
//! let sum = transfer::read_scalar(t.sum());
//! assert_eq!(sum, 3.0);
//! let counted = transfer::transfers() - before;
//! assert!(counted.uploads >= 1 && counted.reads >= 1);
//! ```
#![deny(missing_docs)]

pub mod backends;
pub mod dropout;
pub mod embedding;
pub mod matmul;
pub mod pack;
#[cfg(feature = "wgpu")]
pub mod testing;
pub mod transfer;

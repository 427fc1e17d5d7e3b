//! drove's matmul: burn's matrix product as an operation of drove's own that
//! chooses cubek's kernel per shape class and precision ([`strategy`]),
//! instead of burn 0.21's one fixed kernel that stages f32 as TF32.
//!
//! [`matmul`] is the entry point for code generic over its backend: on the
//! backends of [`crate::backends`] (CUDA fused, wgpu unfused and fused, and
//! `Autodiff` over each) it runs [`MatmulOps::drove_matmul`]; on any other
//! backend it is burn's `matmul`. [`Matmul`] is the switch a training step
//! holds (`--matmul burn|drove`, `--matmul-precision tf32|f32`).
//!
//! The operation is, by backend (each in its file):
//! * `CubeBackend<R>` ([`cube`]): `cubek::matmul::launch::launch_ref` with
//!   the chosen strategy, falling back to cubek's unit kernel where the
//!   device has no tensor cores (as cubek's own `Auto` does);
//! * `Fusion<B>` (`fused.rs`): a custom operation of burn's fusion stream
//!   (`CustomOpIr`, the burn-vision pattern) that runs `B`'s;
//! * `Autodiff<B>` (`autodiff.rs`): a node whose backward is two matmuls
//!   through the same operation, `grad x rhs^T` and `lhs^T x grad`, with
//!   broadcast batch dimensions summed as burn's own matmul backward does.

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod autodiff;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod cube;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod fused;
mod op;
mod ops;
pub mod strategy;

pub use op::{Matmul, matmul};
pub use ops::MatmulOps;
pub use strategy::{Gemm, Kernel, Precision, ShapeClass, choose};

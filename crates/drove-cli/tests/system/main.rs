//! drove's system tests: the `drove` binary and its example programs run as a
//! user runs them, with real processes for ranks, real network namespaces for
//! hosts, real containers and real launchers (mpirun, srun), on the real
//! CoNLL-2003 data and MiniLM weights (`scripts/fetch-assets.sh`).
//!
//! One test binary, one module a feature: the harness runs any two tests at
//! once, whichever files they come from, so a long test no longer leaves a
//! core idle at the end of its file, and the shared helpers (`common`) are
//! compiled and linked once. Run one feature with a filter, for example
//! `cargo test -p drove-cli --test system elastic::`.

mod common;

mod alarm;
mod bad_input;
mod cli;
mod container;
mod control_plane;
mod elastic;
mod gpu;
mod launchers;
mod multihost;
mod own_model;
mod progress;
mod prometheus;
mod report;
mod survive;
mod timeline;
mod tls;
mod train;
mod wgpu;

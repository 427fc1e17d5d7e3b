//! drove's launch contract, as a library: both sides of it.
//!
//! **The launcher** ([`launch`]) starts N ranks of a program on this host, as
//! `drove run --np N -- PROGRAM` does (like `torchrun --standalone` or
//! `horovodrun -np N -H localhost:N`), from a [`LaunchSpec`]:
//!
//! - Without a coordinator address it serves one in-process on 127.0.0.1
//!   (any free port) with a temporary store, removed at the end, and
//!   Prometheus' `/metrics` where asked (its address told to the [`Console`]).
//! - Each rank gets the variables of [`var`]: `DROVE_RANK`, `DROVE_LOCAL_RANK`,
//!   `DROVE_WORLD_SIZE`, `DROVE_LOCAL_WORLD_SIZE`, `DROVE_RUN_ID`,
//!   `DROVE_COORDINATOR`, `DROVE_RESTART_COUNT`, and with a token
//!   `DROVE_TOKEN`; stdin is `/dev/null`.
//! - In a fixed world each rank also gets torchrun's variables, so PyTorch's
//!   `init_process_group` (`env://`) works unchanged: `RANK`, `WORLD_SIZE`,
//!   `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK=0`,
//!   `MASTER_ADDR=127.0.0.1`, `MASTER_PORT` (a free port picked for each
//!   start of the world) and `TORCHELASTIC_RESTART_COUNT`. A drove rank
//!   among them reads drove's, which win (see [`LaunchEnv`]), and leaves
//!   `MASTER_PORT` to PyTorch. An elastic launch's ranks get none of
//!   torchrun's (their ranks change with each world) and inherit none.
//! - Every line a rank writes goes whole to a [`Console`], which prefixes it
//!   `[R] ` ([`PlainConsole`]) or draws rank 0's [`Progress`] as a bar.
//! - Each rank leads its own process group (a terminal's Ctrl-C reaches the
//!   launcher only; stopping a rank stops what it started) and is killed by
//!   the kernel if the launcher dies.
//! - When a rank fails, the coordinator fails the run, or the launcher gets
//!   SIGINT, SIGTERM or SIGHUP, every rank still running gets SIGTERM, then
//!   SIGKILL after the grace; a second signal skips the grace.
//! - A [`RestartPolicy`] starts a failed world again, with
//!   `DROVE_RESTART_COUNT` counting up; at the end every rank leaves the run
//!   on the coordinator, so `drove runs` shows it finished or failed.
//!
//! **The rank side**: [`LaunchEnv`] reads those variables once, each malformed
//! value named, or another launcher's: `mpirun` (OpenMPI), `mpiexec` (MPICH,
//! Intel MPI), Slurm's `srun`, torchrun and PyTorchJob ([`Launcher`]); where
//! such a launcher names a meeting place (`MASTER_ADDR`, a Slurm job's first
//! host) rank 0 serves the coordinator there ([`ServedCoordinator`]); from it come the communicator, a metrics recorder to the
//! coordinator, and the decision to [`Start`] fresh or resume. [`Launched`]
//! bundles them with progress lines for the launcher's bar:
//!
//! ```no_run
//! use drove_launch::{Launched, Progress, RankOutcome, Start};
//!
//! let rank = Launched::join()?; // the other ranks, metrics, progress
//! let first = match rank.start("ckpt/latest".as_ref()) {
//!     Start::Resume => 100, // read your checkpoint
//!     Start::Fresh => 0,
//! };
//! for step in first..200 {
//!     let loss = 1.0 / (step + 1) as f64; // your step, on rank.comm()
//!     rank.record(step, "loss", loss);
//!     rank.progress(&Progress { loss: Some(loss), ..Progress::at(step + 1, 200) });
//! }
//! rank.finish(RankOutcome::Finished { steps: 200 });
//! # Ok::<(), drove_launch::LaunchError>(())
//! ```

#![deny(missing_docs)]

mod connection;
mod error;
mod exit;
pub mod fault;
mod launcher;
mod place;
mod progress;
mod rank;
mod serve;
pub mod var;

pub use connection::{connection, coordinator_clients};
/// The names of the metrics and events a run records (`drove report` and the
/// Prometheus exporter read them).
pub use drove_metrics::metric_names;
pub use error::{EnvError, LaunchError};
pub use exit::{describe, exit_code, signal_exit_code, signal_name};
pub use place::{launch_env, launch_vars};
pub use progress::{PROGRESS_PREFIX, Progress, ProgressMode};

// The launcher side.
pub use drove_control::launcher::status_message;
pub use launcher::console::{Console, PlainConsole, Stream, prefixed};
pub use launcher::coordinator::CoordinatorChoice;
pub use launcher::launch::{
    ElasticLaunch, End, LaunchOutcome, LaunchSpec, MAX_LOCAL_RANKS, check_run_id, default_run_id, launch,
};
pub use launcher::restart::RestartPolicy;
pub use launcher::supervise::Cause;
pub use launcher::watch::{DEFAULT_WATCH_EVERY, WatchChoice};

// The rank side.
pub use rank::env::{LaunchEnv, RendezvousKind, coordinator_from_env, token_from_env};
pub use rank::foreign::{ForeignPlace, Launcher};
pub use rank::launched::{DEFAULT_RUN_ID, Launched, RankOutcome, Ranks, Start, connect_from_env};
pub use rank::nodelist::{NodeListError, expand as expand_nodelist, first_host};
pub use rank::served::{CoordinatorSource, LINGER, ServedCoordinator, slurm_default_port};

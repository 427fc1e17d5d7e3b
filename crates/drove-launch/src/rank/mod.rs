//! The rank side of the launch contract: [`LaunchEnv`](crate::LaunchEnv) reads the variables
//! of `drove run` or of another launcher (mpirun, mpiexec, srun, torchrun,
//! PyTorchJob: [`Launcher`](crate::Launcher)), rank 0 serves the coordinator where such a
//! launcher names a meeting place ([`ServedCoordinator`](crate::ServedCoordinator)), and [`Launched`](crate::Launched)
//! joins the world: its communicator, metrics, progress and end.

pub(crate) mod env;
pub(crate) mod foreign;
pub(crate) mod launched;
pub(crate) mod nodelist;
pub(crate) mod served;

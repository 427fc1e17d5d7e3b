//! The launch contract's variables: every name drove reads or sets, once.

/// This rank's place in the world, `0..DROVE_WORLD_SIZE`.
pub const RANK: &str = "DROVE_RANK";
/// The number of ranks in the world.
pub const WORLD_SIZE: &str = "DROVE_WORLD_SIZE";
/// This rank's place among the ranks on its host (picks its GPU).
pub const LOCAL_RANK: &str = "DROVE_LOCAL_RANK";
/// The number of ranks on this host.
pub const LOCAL_WORLD_SIZE: &str = "DROVE_LOCAL_WORLD_SIZE";
/// A Kubernetes Indexed Job's pod index: the rank when `DROVE_RANK` is unset.
pub const JOB_COMPLETION_INDEX: &str = "JOB_COMPLETION_INDEX";
/// The run the ranks join on the coordinator.
pub const RUN_ID: &str = "DROVE_RUN_ID";
/// The coordinator, `host:port` or a URL.
pub const COORDINATOR: &str = "DROVE_COORDINATOR";
/// The coordinator's bearer token.
pub const TOKEN: &str = "DROVE_TOKEN";
/// The PEM file of the certificate authority an `https://` coordinator's
/// certificate is checked against.
pub const TLS_CA: &str = "DROVE_TLS_CA";
/// How many times the launcher has restarted the world (0 in the first attempt).
pub const RESTART_COUNT: &str = "DROVE_RESTART_COUNT";
/// `launcher`: the launcher draws the progress bar from rank 0's progress lines.
pub const PROGRESS: &str = "DROVE_PROGRESS";
/// A shared folder to rendezvous in, instead of a coordinator.
pub const RENDEZVOUS_DIR: &str = "DROVE_RENDEZVOUS_DIR";
/// Every rank's `host:port`, comma-separated, instead of a coordinator.
pub const PEERS: &str = "DROVE_PEERS";
/// A file of every rank's `host:port`, one a line, instead of a coordinator.
pub const PEERS_FILE: &str = "DROVE_PEERS_FILE";
/// Where to write the run's timeline (Chrome trace-event JSON).
pub const TIMELINE: &str = "DROVE_TIMELINE";
/// An elastic run's world sizes, `MIN:MAX` (set by `drove run --min-np`,
/// or by hand; `drove train ner --world` overrides it).
pub const ELASTIC: &str = "DROVE_ELASTIC";
/// An elastic member's stable id (default: the Indexed Job's index, the
/// launcher's slot, or host and process id).
pub const MEMBER_ID: &str = "DROVE_MEMBER_ID";
/// How long a forming elastic world waits for more members after its
/// minimum, in seconds (default 2).
pub const SETTLE_SECS: &str = "DROVE_SETTLE_SECS";
/// How long an elastic member waits for its next world to form, in
/// seconds (default 600); below MIN that long, the run fails. A rank of a
/// fixed world meeting through a coordinator waits that long for it and
/// its peers (default 60).
pub const RENDEZVOUS_TIMEOUT_SECS: &str = "DROVE_RENDEZVOUS_TIMEOUT_SECS";
/// The port rank 0 serves the coordinator on in a Slurm step (default
/// 29400 plus the job id modulo 1000).
pub const COORDINATOR_PORT: &str = "DROVE_COORDINATOR_PORT";
/// How often a joined rank tells the coordinator it is alive, in
/// seconds (0: never; default 2).
pub const HEARTBEAT_SECS: &str = "DROVE_HEARTBEAT_SECS";
/// The data plane's listen address (default: the address that routes to
/// the coordinator, any port).
pub const BIND: &str = "DROVE_BIND";
/// An op's deadline, in seconds (default 30).
pub const COMM_TIMEOUT: &str = "DROVE_COMM_TIMEOUT";
/// When a waiting op names the ranks it waits for, in seconds (default
/// 10, at most a third of `DROVE_COMM_TIMEOUT` when that is set).
pub const COMM_WARN_AFTER: &str = "DROVE_COMM_WARN_AFTER";
/// How long an op waits for peers that are alive past its deadline, in
/// seconds (default 600).
pub const COMM_HANG_LIMIT: &str = "DROVE_COMM_HANG_LIMIT";
/// The data transport: `auto` (default), `tcp` or `hierarchical`.
pub const COMM_TRANSPORT: &str = "DROVE_COMM_TRANSPORT";
/// This process's host identity: ranks with equal ids share memory
/// (default: the kernel's boot id and the network namespace).
pub const HOST_ID: &str = "DROVE_HOST_ID";
/// torchrun's and PyTorchJob's meeting host: rank 0 serves the
/// coordinator at `MASTER_ADDR:MASTER_PORT` when drove's own variables are
/// not set. `drove run` sets it (`127.0.0.1`) for PyTorch's `env://`
/// rendezvous in a fixed world.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// torchrun's and PyTorchJob's meeting port. `drove run` sets it to a free
/// port picked for each start of a fixed world, which PyTorch's store binds
/// (drove's ranks, reading `DROVE_COORDINATOR`, never do).
pub const MASTER_PORT: &str = "MASTER_PORT";
/// torchrun's rank (`DROVE_RANK`'s value when `drove run` sets it); read as
/// torchrun's place only when `DROVE_WORLD_SIZE` is not set.
pub const TORCH_RANK: &str = "RANK";
/// torchrun's world size (`DROVE_WORLD_SIZE`'s value when `drove run` sets it).
pub const TORCH_WORLD_SIZE: &str = "WORLD_SIZE";
/// torchrun's local rank (`DROVE_LOCAL_RANK`'s value when `drove run` sets it).
pub const TORCH_LOCAL_RANK: &str = "LOCAL_RANK";
/// torchrun's ranks on this host (`DROVE_LOCAL_WORLD_SIZE`'s value when
/// `drove run` sets it).
pub const TORCH_LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// torchrun's node rank (`0`: `drove run` starts its ranks on one host).
pub const GROUP_RANK: &str = "GROUP_RANK";
/// torchrun's restart count (`DROVE_RESTART_COUNT`'s value when `drove run`
/// sets it).
pub const TORCHELASTIC_RESTART_COUNT: &str = "TORCHELASTIC_RESTART_COUNT";
/// Every torchrun variable `drove run` gives the ranks of a fixed world,
/// and removes from those of an elastic launch (where no rank set at the
/// start stays right).
pub const TORCHRUN: [&str; 8] = [
    TORCH_RANK,
    TORCH_WORLD_SIZE,
    TORCH_LOCAL_RANK,
    TORCH_LOCAL_WORLD_SIZE,
    GROUP_RANK,
    MASTER_ADDR,
    MASTER_PORT,
    TORCHELASTIC_RESTART_COUNT,
];
/// The hosts of a Slurm job, e.g. `node[01-04,07]`.
pub const SLURM_JOB_NODELIST: &str = "SLURM_JOB_NODELIST";
/// A Slurm job's id (the run id of its ranks by default).
pub const SLURM_JOB_ID: &str = "SLURM_JOB_ID";
/// A Slurm step's id within its job.
pub const SLURM_STEP_ID: &str = "SLURM_STEP_ID";
/// The Slurm node a task runs on.
pub const SLURMD_NODENAME: &str = "SLURMD_NODENAME";
/// An OpenMPI job's id (the run id of its ranks by default).
pub const OMPI_JOB_ID: &str = "OMPI_MCA_ess_base_jobid";
/// torchrun's run id (`none` when not given).
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
/// Most metric points a rank holds waiting for the coordinator.
pub const METRICS_CAPACITY: &str = "DROVE_METRICS_CAPACITY";
/// How long a rank waits at its end for its last metric points, in seconds.
pub const METRICS_FLUSH_SECS: &str = "DROVE_METRICS_FLUSH_SECS";

//! Starting the ranks: each the leader of its own process group (so a
//! terminal's Ctrl-C reaches the launcher only, and stopping a rank stops what
//! it started), killed by the kernel if the launcher dies, stdin `/dev/null`,
//! its stdout and stderr relayed, and one thread waiting for it.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, mpsc};

use crate::error::LaunchError;
use crate::launcher::child::rank_vars;
use crate::launcher::console::{Console, Stream};
use crate::launcher::relay::{THREAD_STACK, relay};
use crate::var;

/// What the supervisor hears about.
pub(crate) enum SupervisorEvent {
    /// Rank `.0` ended with `.1`.
    Exited(usize, std::io::Result<ExitStatus>),
    /// The launcher received this signal.
    Signal(i32),
    /// The coordinator failed the run (e.g. a rank stopped sending heartbeats).
    RunFailed(String),
}

/// One rank to start: the program, its arguments and environment.
pub(crate) struct RankCommand<'a> {
    pub program: &'a OsString,
    pub args: &'a [OsString],
    /// The attempt's variables, the same for every rank.
    pub env: &'a [(String, String)],
    /// An elastic launch's member ids are this prefix and the slot
    /// (`DROVE_MEMBER_ID`), the same for a slot's restarted process.
    pub member_prefix: Option<&'a str>,
    /// A fixed world: each rank also gets torchrun's `RANK` and
    /// `LOCAL_RANK` (the attempt's `env` holds the rest of torchrun's);
    /// otherwise none of torchrun's variables is inherited (see `child.rs`).
    pub torch: bool,
}

impl RankCommand<'_> {
    /// The inherited variables a rank's process must not keep: torchrun's,
    /// in an elastic launch.
    pub(crate) fn unset(&self) -> &'static [&'static str] {
        if self.torch { &[] } else { &var::TORCHRUN }
    }

    /// Every variable rank `rank`'s process is given over what it inherits,
    /// a later one winning: the attempt's, then its own.
    pub(crate) fn vars(&self, rank: usize) -> Vec<(String, String)> {
        let own = rank_vars(rank, self.torch, self.member_prefix);
        self.env.iter().cloned().chain(own.into_iter().map(|(k, v)| (k.to_string(), v))).collect()
    }
}

/// The ranks started so far, by process id (a restarted slot's replaces its
/// predecessor's).
pub(crate) struct Started {
    pub pids: Vec<u32>,
    /// Relay threads running (each sends once on `relays_done` at its end).
    pub relays: usize,
    pub relays_done: mpsc::Receiver<()>,
    relay_tx: mpsc::Sender<()>,
}

/// Starts (or restarts) slot `rank` and watches it; its pid takes the slot's place.
pub(crate) fn spawn_slot(
    rank: usize,
    command: &RankCommand<'_>,
    console: &Arc<dyn Console>,
    events: &mpsc::Sender<SupervisorEvent>,
    started: &mut Started,
) -> Result<(), LaunchError> {
    let child = spawn_rank(rank, command)?;
    let relay_tx = started.relay_tx.clone();
    watch(rank, child, console, events, &relay_tx, started)
}

/// Starts ranks `0..np`; stops at the first that cannot start (or be
/// watched), returning the ones started and that error.
pub(crate) fn spawn_world(
    np: usize,
    command: &RankCommand<'_>,
    console: &Arc<dyn Console>,
    events: &mpsc::Sender<SupervisorEvent>,
) -> (Started, Option<LaunchError>) {
    let (relay_tx, relays_done) = mpsc::channel::<()>();
    let mut started = Started { pids: Vec::with_capacity(np), relays: 0, relays_done, relay_tx };
    for rank in 0..np {
        if let Err(e) = spawn_slot(rank, command, console, events, &mut started) {
            return (started, Some(e));
        }
    }
    (started, None)
}

fn spawn_rank(rank: usize, command: &RankCommand<'_>) -> Result<Child, LaunchError> {
    let mut cmd = Command::new(command.program);
    for name in command.unset() {
        cmd.env_remove(name);
    }
    cmd.args(command.args)
        .envs(command.vars(rank))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid, kill).
    unsafe {
        cmd.pre_exec(move || die_with_parent(parent));
    }
    cmd.spawn().map_err(|source| LaunchError::Spawn {
        rank,
        program: command.program.to_string_lossy().into_owned(),
        source,
    })
}

/// In the child: be killed when `parent` dies, also if it died already.
fn die_with_parent(parent: libc::pid_t) -> std::io::Result<()> {
    let _ = parent;
    #[cfg(target_os = "linux")]
    // SAFETY: prctl, getppid and kill are async-signal-safe and touch no memory.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() != parent {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    Ok(())
}

/// Relays the rank's streams and starts the thread that waits for it.
fn watch(
    rank: usize,
    mut child: Child,
    console: &Arc<dyn Console>,
    events: &mpsc::Sender<SupervisorEvent>,
    relay_tx: &mpsc::Sender<()>,
    started: &mut Started,
) -> Result<(), LaunchError> {
    let fresh = rank >= started.pids.len();
    if fresh {
        started.pids.push(child.id());
    } else {
        started.pids[rank] = child.id();
    }
    tracing::debug!("started rank {rank} as pid {}", child.id());
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    for (source, stream) in
        [(Box::new(stdout) as Box<dyn Read + Send>, Stream::Stdout), (Box::new(stderr), Stream::Stderr)]
    {
        match relay(rank, stream, source, console.clone(), relay_tx.clone()) {
            Ok(_) => started.relays += 1,
            Err(e) => tracing::warn!("cannot relay rank {rank}'s output: {e}"),
        }
    }
    let tx = events.clone();
    let waiter =
        std::thread::Builder::new().name(format!("wait-{rank}")).stack_size(THREAD_STACK).spawn(move || {
            let status = child.wait();
            let _ = tx.send(SupervisorEvent::Exited(rank, status));
        });
    waiter.map(drop).map_err(|e| {
        // Without a waiter this rank would never be seen to end: kill it.
        signal_group(started.pids[rank], libc::SIGKILL);
        if fresh {
            started.pids.pop();
        }
        LaunchError::io(format!("cannot watch rank {rank}"), e)
    })
}

/// Sends `sig` to the process group of `pid` (each rank leads its own).
pub(crate) fn signal_group(pid: u32, sig: i32) {
    // SAFETY: kill(2) with our own unreaped child's process group (or the child
    // itself); no memory is involved.
    unsafe {
        if libc::kill(-(pid as libc::pid_t), sig) != 0 {
            libc::kill(pid as libc::pid_t, sig);
        }
    }
}

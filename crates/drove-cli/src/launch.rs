//! `drove run --np N -- PROGRAM ARGS...`: starts N ranks of a program on this host
//! (like `torchrun --standalone` or `horovodrun -np N -H localhost:N`).
//!
//! - Without `--coordinator`, a coordinator runs in-process on 127.0.0.1 (any free
//!   port) with a temporary store, removed at exit.
//! - Each rank gets `DROVE_RANK`, `DROVE_LOCAL_RANK`, `DROVE_LOCAL_WORLD_SIZE`,
//!   `DROVE_WORLD_SIZE`, `DROVE_RUN_ID`, `DROVE_COORDINATOR` (host:port) and, with a
//!   token, `DROVE_TOKEN`; stdin is `/dev/null`.
//! - Every line a rank writes is relayed whole, prefixed `[R] `: stdout to stdout,
//!   stderr to stderr.
//! - Each rank is the leader of its own process group (so a terminal's Ctrl-C
//!   reaches `drove run` only, and stopping a rank stops what it started) and is
//!   killed by the kernel if `drove run` dies.
//! - When a rank fails (non-zero exit or a signal), or `drove run` gets SIGINT,
//!   SIGTERM or SIGHUP, every rank still running gets SIGTERM, then SIGKILL after
//!   `--stop-grace-secs`; a second signal skips the grace. The exit code is the
//!   first failing rank's (128 + N for signal N), or 128 + N when interrupted by
//!   signal N, or 0.
//! - At the end every rank leaves the run on the coordinator (with the error for
//!   failed ranks), so `drove runs` shows it finished or failed.
//!
//! Waiting is event-driven: one thread per rank waits for it and reports on a
//! channel, and signals arrive on the same channel; only the grace period is a
//! timeout.

use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::io::IsTerminal as _;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use drove_proto::client::{Authed, Clients};
use drove_proto::v1::rendezvous_client::RendezvousClient;
use drove_proto::v1::{HeartbeatRequest, LeaveRequest, RunState};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::signal::unix::{SignalKind, signal};

use crate::control::{self, status_error};
use crate::parse;

/// Stack of the relay and wait threads (three per rank; they hold little).
const THREAD_STACK: usize = 256 << 10;

/// Settings of `drove run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Number of ranks (processes) to start on this host.
    #[arg(long, value_name = "N", value_parser = np)]
    np: usize,
    /// Keep the in-process coordinator's store (metrics, runs) in this folder
    /// instead of a temporary one; query it later with `drove metrics --store DIR`.
    #[arg(long, value_name = "DIR", conflicts_with = "coordinator")]
    pub store: Option<std::path::PathBuf>,
    /// A running coordinator (host:port) to use instead of starting one in-process.
    #[arg(long, value_name = "ADDR")]
    coordinator: Option<String>,
    /// Bearer token: given to the ranks as DROVE_TOKEN and required by the
    /// in-process coordinator [default: $DROVE_TOKEN].
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Run id [default: run-MILLIS-PID, the clock in ms and the process id].
    #[arg(long, value_name = "ID", value_parser = run_id)]
    run_id: Option<String>,
    /// Restart the whole world up to N times when a rank fails (torchrun's
    /// --max-restarts): every rank is stopped and all start again with
    /// DROVE_RESTART_COUNT set (`drove train ner` then resumes from its latest
    /// checkpoint). After N restarts the run fails with the last error.
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_restarts: u32,
    /// Seconds between SIGTERM and SIGKILL when stopping the ranks.
    #[arg(long, default_value_t = 10.0, value_name = "S", value_parser = parse::seconds)]
    stop_grace_secs: f64,
    /// The program every rank runs, and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROGRAM")]
    command: Vec<OsString>,
}

fn np(s: &str) -> Result<usize, String> {
    let n = parse::at_least(s, 1, "np", " rank")?;
    if n > 4096 { Err(format!("np must be at most 4096 ranks on one host, found {n}")) } else { Ok(n) }
}

fn run_id(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 {
        return Err(format!("run id must be 1 to 128 characters, found {}", s.len()));
    }
    Ok(s.to_string())
}

fn default_run_id() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("run-{ms}-{}", std::process::id())
}

/// What the supervisor waits for.
enum Event {
    /// Rank `.0` ended with `.1`.
    Exited(usize, std::io::Result<ExitStatus>),
    /// `drove run` received this signal.
    Signal(i32),
    /// The coordinator failed the run (e.g. a rank stopped sending heartbeats).
    RunFailed(String),
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        n => format!("signal {n}"),
    }
}

/// The shell-style exit code of a rank: its code, or 128 + the signal.
fn exit_code(status: &ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        (None, None) => 1,
    }
}

fn describe(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by {}", signal_name(s)),
        (None, None) => format!("ended with {status}"),
    }
}

/// Why the ranks are being stopped.
#[derive(Clone, Copy)]
enum Cause {
    RankFailed(usize),
    Signal(i32),
    RunFailed,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::RankFailed(r) => write!(f, "after rank {r} failed"),
            Cause::Signal(s) => write!(f, "on {}", signal_name(*s)),
            Cause::RunFailed => write!(f, "after the coordinator failed the run"),
        }
    }
}

/// Sends `sig` to the process group of `pid` (each rank leads its own).
fn signal_group(pid: u32, sig: i32) {
    // SAFETY: kill(2) with our own unreaped child's process group (or the child
    // itself); no memory is involved.
    unsafe {
        if libc::kill(-(pid as libc::pid_t), sig) != 0 {
            libc::kill(pid as libc::pid_t, sig);
        }
    }
}

/// The prefix of the progress lines rank 0 writes for the launcher's bar
/// (`DROVE_PROGRESS=launcher`), followed by one JSON object.
pub const PROGRESS_PREFIX: &str = "drove-progress ";

/// One progress line of rank 0, drawn on the bar.
fn show_progress(bar: &ProgressBar, json: &[u8]) {
    let Ok(p) = serde_json::from_slice::<serde_json::Value>(json) else { return };
    if let Some(total) = p["total"].as_u64() {
        bar.set_length(total);
    }
    if let Some(step) = p["step"].as_u64() {
        bar.set_position(step);
    }
    if let (Some(epoch), Some(loss), Some(rate)) =
        (p["epoch"].as_u64(), p["loss"].as_f64(), p["sentences_per_s"].as_f64())
    {
        bar.set_message(format!("epoch {epoch} loss {loss:.4} {rate:.1} sent/s"));
    }
}

/// The bar `drove run` draws on a terminal, fed by rank 0.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps {msg} (ETA {eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Copies `source` to stdout or stderr line by line, each line prefixed and
/// written whole under the stream's lock; with a progress bar, rank 0's
/// progress lines move the bar and other lines are printed above it. Keeps
/// draining if the destination is closed, so a rank never blocks on a full pipe.
fn relay(
    rank: usize,
    source: impl Read + Send + 'static,
    to_stderr: bool,
    done: mpsc::Sender<()>,
    bar: Option<ProgressBar>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("relay-{rank}")).stack_size(THREAD_STACK).spawn(move || {
        let mut reader = BufReader::with_capacity(64 << 10, source);
        let prefix = format!("[{rank}] ");
        let (mut line, mut out) = (Vec::new(), Vec::new());
        let mut open = true;
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            if !open {
                continue;
            }
            if let Some(bar) = &bar {
                if let Some(json) = line.strip_prefix(PROGRESS_PREFIX.as_bytes()) {
                    show_progress(bar, json);
                    continue;
                }
                let text = String::from_utf8_lossy(&line);
                let text = format!("{prefix}{}", text.trim_end_matches('\n'));
                if to_stderr {
                    bar.println(text);
                } else {
                    bar.suspend(|| {
                        let mut stdout = std::io::stdout().lock();
                        let _ = writeln!(stdout, "{text}").and_then(|()| stdout.flush());
                    });
                }
                continue;
            }
            out.clear();
            out.extend_from_slice(prefix.as_bytes());
            out.extend_from_slice(&line);
            if !line.ends_with(b"\n") {
                out.push(b'\n');
            }
            let written = if to_stderr {
                std::io::stderr().lock().write_all(&out)
            } else {
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(&out).and_then(|()| stdout.flush())
            };
            open = written.is_ok();
        }
        let _ = done.send(());
    })
}

/// Forwards SIGINT, SIGTERM and SIGHUP to `tx`. The handlers are installed before
/// this returns, so from then on these signals no longer kill `drove run`.
fn forward_signals(rt: &tokio::runtime::Runtime, tx: mpsc::Sender<Event>) -> anyhow::Result<()> {
    let _guard = rt.enter();
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    rt.spawn(async move {
        loop {
            let sig = tokio::select! {
                Some(()) = int.recv() => libc::SIGINT,
                Some(()) = term.recv() => libc::SIGTERM,
                Some(()) = hup.recv() => libc::SIGHUP,
                else => return,
            };
            if tx.send(Event::Signal(sig)).is_err() {
                return;
            }
        }
    });
    Ok(())
}

/// How the ranks ended.
struct Outcome {
    /// Each rank's status (an error if waiting for it failed).
    statuses: Vec<Result<ExitStatus, String>>,
    /// The first rank that failed on its own, with its exit code.
    first_failure: Option<(usize, u8)>,
    /// Why the ranks were stopped, if they were.
    cause: Option<Cause>,
    /// The signal that interrupted `drove run`, if one did.
    interrupted: Option<i32>,
    /// Why the coordinator failed the run, if it did before any rank failed.
    run_failed: Option<String>,
}

struct Spec<'a> {
    np: usize,
    program: &'a OsString,
    args: &'a [OsString],
    env: Vec<(&'static str, String)>,
    grace: Duration,
    /// The bar rank 0's progress lines move (on a terminal).
    bar: Option<ProgressBar>,
}

/// Starts the ranks and supervises them until every one has ended.
fn supervise(
    spec: &Spec<'_>,
    tx: mpsc::Sender<Event>,
    rx: &mpsc::Receiver<Event>,
) -> anyhow::Result<Outcome> {
    let np = spec.np;
    let (relay_tx, relay_rx) = mpsc::channel::<()>();
    let mut pids: Vec<u32> = Vec::with_capacity(np);
    let parent = std::process::id() as libc::pid_t;
    let mut relays = 0usize;
    let mut spawn_error = None;
    for rank in 0..np {
        let mut cmd = Command::new(spec.program);
        cmd.args(spec.args)
            .envs(spec.env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("DROVE_RANK", rank.to_string())
            .env("DROVE_LOCAL_RANK", rank.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls (prctl, getppid, kill).
        unsafe {
            cmd.pre_exec(move || {
                let _ = parent;
                #[cfg(target_os = "linux")]
                {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // drove run died between fork and prctl: do not outlive it.
                    if libc::getppid() != parent {
                        libc::kill(libc::getpid(), libc::SIGKILL);
                    }
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                spawn_error = Some(
                    anyhow::Error::new(e)
                        .context(format!("cannot start rank {rank}: {}", spec.program.to_string_lossy())),
                );
                break;
            }
        };
        pids.push(child.id());
        tracing::debug!("started rank {rank} as pid {}", child.id());
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        for (source, to_stderr) in
            [(Box::new(stdout) as Box<dyn Read + Send>, false), (Box::new(stderr), true)]
        {
            match relay(rank, source, to_stderr, relay_tx.clone(), spec.bar.clone()) {
                Ok(_) => relays += 1,
                Err(e) => tracing::warn!("cannot relay rank {rank}'s output: {e}"),
            }
        }
        let tx = tx.clone();
        let waiter = std::thread::Builder::new().name(format!("wait-{rank}")).stack_size(THREAD_STACK).spawn(
            move || {
                let status = child.wait();
                let _ = tx.send(Event::Exited(rank, status));
            },
        );
        if let Err(e) = waiter {
            // Without a waiter this rank would never be seen to end: kill it and
            // stop starting ranks.
            signal_group(pids.pop().expect("this rank's pid"), libc::SIGKILL);
            spawn_error = Some(anyhow::Error::new(e).context(format!("cannot watch rank {rank}")));
            break;
        }
    }
    drop(relay_tx);
    drop(tx);

    let started = pids.len();
    let mut statuses: Vec<Option<Result<ExitStatus, String>>> = vec![None; started];
    let mut running = started;
    let mut first_failure = None;
    let mut cause = None;
    let mut interrupted = None;
    let mut run_failed = None;
    let mut kill_at: Option<Instant> = None;

    let stop = |why: Cause, statuses: &[Option<Result<ExitStatus, String>>]| {
        let alive: Vec<usize> = (0..statuses.len()).filter(|&r| statuses[r].is_none()).collect();
        if !alive.is_empty() {
            tracing::info!("stopping ranks {alive:?} {why}: SIGTERM, SIGKILL after {:?}", spec.grace);
        }
        for &r in &alive {
            signal_group(pids[r], libc::SIGTERM);
        }
        Instant::now() + spec.grace
    };
    let kill_all = |statuses: &[Option<Result<ExitStatus, String>>]| {
        for r in (0..statuses.len()).filter(|&r| statuses[r].is_none()) {
            signal_group(pids[r], libc::SIGKILL);
        }
    };

    if let Some(e) = &spawn_error {
        tracing::error!("{e:#}");
        cause = Some(Cause::RankFailed(started));
        kill_at = Some(stop(Cause::RankFailed(started), &statuses));
    }

    while running > 0 {
        let event = match kill_at {
            Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(ev) => Some(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => bail!("lost track of the ranks"),
            },
            None => Some(rx.recv().map_err(|_| anyhow!("lost track of the ranks"))?),
        };
        match event {
            None => {
                let alive: Vec<usize> = (0..started).filter(|&r| statuses[r].is_none()).collect();
                tracing::warn!("ranks {alive:?} still run {:?} after SIGTERM: sending SIGKILL", spec.grace);
                kill_all(&statuses);
                kill_at = None;
            }
            Some(Event::Exited(rank, status)) => {
                running -= 1;
                let status = status.map_err(|e| format!("waiting for it failed: {e}"));
                let failed = match &status {
                    Ok(s) if s.success() => None,
                    Ok(s) => Some((exit_code(s), describe(s))),
                    Err(e) => Some((1, e.clone())),
                };
                statuses[rank] = Some(status);
                if let Some((code, what)) = failed {
                    if cause.is_none() {
                        tracing::error!("rank {rank} {what}");
                        first_failure = Some((rank, code));
                        cause = Some(Cause::RankFailed(rank));
                        kill_at = Some(stop(Cause::RankFailed(rank), &statuses));
                    } else {
                        tracing::info!("rank {rank} {what}");
                    }
                }
            }
            Some(Event::RunFailed(why)) => {
                if cause.is_none() {
                    tracing::error!("the coordinator failed the run: {why}");
                    run_failed = Some(why);
                    cause = Some(Cause::RunFailed);
                    kill_at = Some(stop(Cause::RunFailed, &statuses));
                }
            }
            Some(Event::Signal(sig)) => {
                if cause.is_none() {
                    tracing::warn!("received {}", signal_name(sig));
                    interrupted = Some(sig);
                    cause = Some(Cause::Signal(sig));
                    kill_at = Some(stop(Cause::Signal(sig), &statuses));
                } else {
                    tracing::warn!(
                        "received {} while stopping the ranks: killing them now",
                        signal_name(sig)
                    );
                    interrupted.get_or_insert(sig);
                    kill_all(&statuses);
                    kill_at = None;
                }
            }
        }
    }

    // Every rank has ended; their pipes close unless something they started
    // still holds them. Wait for the relays to drain, but not for such strays.
    let drain_until = Instant::now() + Duration::from_secs(2);
    for _ in 0..relays {
        if relay_rx.recv_timeout(drain_until.saturating_duration_since(Instant::now())).is_err() {
            tracing::warn!("a rank's output is still held open by a process it started; not waiting for it");
            break;
        }
    }
    if let Some(e) = spawn_error {
        return Err(e);
    }
    Ok(Outcome {
        statuses: statuses.into_iter().map(|s| s.expect("every rank ended")).collect(),
        first_failure,
        cause,
        interrupted,
        run_failed,
    })
}

/// Checks that the token is accepted and that no live run has this id (its
/// ranks would find the run full). A finished or failed run id may be reused.
async fn check_run_is_free(clients: &mut Clients, run_id: &str) -> anyhow::Result<()> {
    let probe = clients.rendezvous.heartbeat(HeartbeatRequest {
        run_id: run_id.to_string(),
        rank: 0,
        observer: true,
    });
    match tokio::time::timeout(Duration::from_secs(15), probe).await {
        Err(_) => bail!("the coordinator did not answer within 15 s"),
        Ok(Err(s)) if s.code() == tonic::Code::NotFound => Ok(()),
        Ok(Err(s)) => Err(status_error(s)),
        Ok(Ok(r)) => match r.into_inner().state() {
            RunState::Finished | RunState::Failed => Ok(()),
            state => bail!("run {run_id:?} is already {state} on the coordinator; choose another --run-id"),
        },
    }
}

/// Asks the coordinator for the run's state every second, and reports once if
/// it failed the run with a reason (a hung rank) after this attempt's world
/// was seen running; a coordinator that is away (restarting) is asked again
/// at the next tick.
async fn watch_run(mut rendezvous: RendezvousClient<Authed>, run_id: String, tx: mpsc::Sender<Event>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running = false;
    loop {
        tick.tick().await;
        let probe =
            rendezvous.heartbeat(HeartbeatRequest { run_id: run_id.clone(), rank: 0, observer: true });
        if let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(5), probe).await {
            let reply = reply.into_inner();
            running |= reply.state() == RunState::Running;
            if running && reply.state() == RunState::Failed && !reply.error.is_empty() {
                let _ = tx.send(Event::RunFailed(reply.error));
                return;
            }
        }
    }
}

/// Tells the coordinator that every rank left (with an error for failed ones).
/// Each call is retried for up to 15 s while the coordinator is unavailable (a
/// restart), so the run ends finished or failed there all the same.
async fn leave_all(clients: &mut Clients, run_id: &str, outcome: &Outcome) {
    for (rank, status) in outcome.statuses.iter().enumerate() {
        let error = match (status, outcome.cause) {
            (Ok(s), _) if s.success() => String::new(),
            (Ok(s), Some(Cause::RankFailed(r))) if r == rank => describe(s),
            (Ok(s), Some(cause)) => format!("stopped by drove run {cause}: {}", describe(s)),
            (Ok(s), None) => describe(s),
            (Err(e), _) => e.clone(),
        };
        let request = LeaveRequest { run_id: run_id.to_string(), rank: rank as i32, error };
        match leave_retrying(&mut clients.rendezvous, request, Duration::from_secs(15)).await {
            Ok(Ok(_)) => {}
            Ok(Err(s)) if s.code() == tonic::Code::NotFound => {
                tracing::debug!("run {run_id:?} never joined the coordinator");
                return;
            }
            Ok(Err(s)) => {
                tracing::warn!("rank {rank} could not leave run {run_id:?}: {:#}", status_error(s));
            }
            Err(_) => {
                tracing::warn!("the coordinator did not answer Leave within 15 s");
                return;
            }
        }
    }
}

/// One Leave, retried after 0.2 s, 0.4 s, ... (at most 2 s apart) while the
/// coordinator is unavailable, until `limit` passes (then `Err`).
async fn leave_retrying(
    rendezvous: &mut RendezvousClient<Authed>,
    request: LeaveRequest,
    limit: Duration,
) -> Result<Result<tonic::Response<drove_proto::v1::LeaveResponse>, tonic::Status>, tokio::time::error::Elapsed>
{
    tokio::time::timeout(limit, async {
        let mut wait = Duration::from_millis(200);
        loop {
            match rendezvous.leave(request.clone()).await {
                Err(s) if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown) => {
                    tracing::debug!("Leave: {} ({:?}); retrying in {wait:?}", s.message(), s.code());
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                other => return other,
            }
        }
    })
    .await
}

/// `drove run`.
pub fn run(args: &RunArgs) -> anyhow::Result<ExitCode> {
    let run_id = args.run_id.clone().unwrap_or_else(default_run_id);
    let token = control::token_or_env(args.token.as_deref());
    let (program, program_args) = args.command.split_first().expect("clap requires PROGRAM");
    let rt = control::runtime("drove-run")?;
    let (tx, rx) = mpsc::channel();
    forward_signals(&rt, tx.clone())?;

    // The coordinator: in-process on a temporary store, or the one given.
    let mut embedded = None;
    let addr = match &args.coordinator {
        Some(addr) => addr.clone(),
        None => {
            let store = match &args.store {
                Some(dir) => {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating the coordinator's store {}", dir.display()))?;
                    None
                }
                None => Some(
                    tempfile::Builder::new()
                        .prefix("drove-run-store-")
                        .tempdir()
                        .context("creating the coordinator's temporary store")?,
                ),
            };
            let store_path = match (&store, &args.store) {
                (Some(t), _) => t.path().to_path_buf(),
                (None, Some(dir)) => dir.clone(),
                (None, None) => unreachable!("one of the two is set"),
            };
            let config = drove_coordinator::Config {
                listen: ([127, 0, 0, 1], 0).into(),
                store: store_path,
                token: token.clone(),
                ..Default::default()
            };
            let server = rt
                .block_on(drove_coordinator::start(&config))
                .map_err(|e| anyhow!("starting the in-process coordinator: {e}"))?;
            let addr = server.addr().to_string();
            embedded = Some((server, store));
            addr
        }
    };
    let mut clients = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(15), control::connect(&addr, token.as_deref())).await
        })
        .map_err(|_| anyhow!("the coordinator at {addr} did not accept a connection within 15 s"))??;
    rt.block_on(check_run_is_free(&mut clients, &run_id))?;
    tracing::info!(
        coordinator = %addr,
        run_id = %run_id,
        np = args.np,
        in_process = embedded.is_some(),
        "starting {} ranks of {}",
        args.np,
        program.to_string_lossy()
    );

    // As torchrun sets OMP_NUM_THREADS: the ranks share this host's cores.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).div_ceil(args.np).max(1);
    let mut env = vec![
        ("DROVE_WORLD_SIZE", args.np.to_string()),
        ("DROVE_LOCAL_WORLD_SIZE", args.np.to_string()),
        ("DROVE_RUN_ID", run_id.clone()),
        ("DROVE_COORDINATOR", addr.clone()),
    ];
    if let Some(t) = &token {
        env.push(("DROVE_TOKEN", t.clone()));
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        env.push(("RAYON_NUM_THREADS", threads.to_string()));
    }
    // One bar for the run on a terminal, fed by rank 0; lines as they come otherwise.
    let bar = std::io::stderr().is_terminal().then(progress_bar);
    let mut restarts = 0u32;
    let outcome = loop {
        let mut env = env.clone();
        env.push(("DROVE_RESTART_COUNT", restarts.to_string()));
        if bar.is_some() {
            env.push(("DROVE_PROGRESS", "launcher".into()));
        }
        let spec = Spec {
            np: args.np,
            program,
            args: program_args,
            env,
            grace: Duration::from_secs_f64(args.stop_grace_secs),
            bar: bar.clone(),
        };
        let watcher = rt.spawn(watch_run(clients.rendezvous.clone(), run_id.clone(), tx.clone()));
        let outcome = supervise(&spec, tx.clone(), &rx);
        watcher.abort();
        let Ok(outcome) = outcome else { break outcome };
        rt.block_on(leave_all(&mut clients, &run_id, &outcome));
        let why = match (&outcome.run_failed, outcome.first_failure) {
            (Some(why), _) => why.clone(),
            (None, Some((rank, code))) => format!("rank {rank} failed (exit code {code})"),
            (None, None) => break Ok(outcome),
        };
        if outcome.interrupted.is_some() || restarts >= args.max_restarts {
            if args.max_restarts > 0 {
                tracing::error!("run {run_id}: giving up after {restarts} restart(s): {why}");
            }
            break Ok(outcome);
        }
        restarts += 1;
        tracing::warn!("run {run_id}: {why}; restarting every rank ({restarts} of {})", args.max_restarts);
    };
    drop(tx);
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    drop(clients);
    if let Some((server, store)) = embedded {
        if rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await })
            .is_err()
        {
            tracing::warn!("the in-process coordinator did not stop within 5 s");
        }
        drop(store);
    }
    let outcome = outcome?;
    if let Some(why) = &outcome.run_failed {
        eprintln!("error: run {run_id} failed: {why}");
        return Ok(ExitCode::from(1));
    }
    let code = match (outcome.first_failure, outcome.interrupted) {
        (Some((rank, code)), _) => {
            tracing::info!("run {run_id} failed: rank {rank} failed first; exit code {code}");
            code
        }
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => 0,
    };
    Ok(ExitCode::from(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(&ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(&ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(&ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(describe(&ExitStatus::from_raw(libc::SIGKILL)), "was killed by SIGKILL");
    }

    #[test]
    fn run_ids_are_checked_and_default_to_time_and_pid() {
        assert!(run_id("").is_err());
        assert!(run_id(&"x".repeat(129)).is_err());
        assert_eq!(run_id("t1"), Ok("t1".into()));
        let id = default_run_id();
        assert!(id.starts_with("run-") && id.ends_with(&format!("-{}", std::process::id())), "{id}");
    }
}

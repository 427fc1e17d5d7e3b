//! One attempt: start the world, wait for every rank to end, and stop the
//! world (SIGTERM, then SIGKILL after the grace) when a rank fails, the
//! coordinator fails the run, or the launcher is signalled. Waiting is
//! event-driven: one thread per rank reports on a channel, signals and the
//! coordinator's verdict arrive on the same channel; only the grace is a timeout.

use std::process::ExitStatus;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::console::Console;
use crate::error::LaunchError;
use crate::exit::{describe, exit_code, signal_name};
use crate::spawn::{Event, RankCommand, Started, signal_group, spawn_world};

/// Why the ranks are being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// This rank failed first.
    RankFailed(usize),
    /// The launcher received this signal.
    Signal(i32),
    /// The coordinator failed the run.
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

/// How the ranks of one attempt ended.
#[derive(Debug)]
pub(crate) struct Attempt {
    /// Each rank's status (an error if waiting for it failed).
    pub statuses: Vec<Result<ExitStatus, String>>,
    /// Why it ended as it did.
    pub verdict: Verdict,
}

/// What the supervisor decided while the ranks ran.
#[derive(Clone, Debug, Default)]
pub(crate) struct Verdict {
    /// The first rank that failed on its own, with its exit code.
    pub first_failure: Option<(usize, u8)>,
    /// Why the ranks were stopped, if they were.
    pub cause: Option<Cause>,
    /// The signal that interrupted the launcher, if one did.
    pub interrupted: Option<i32>,
    /// Why the coordinator failed the run, if it did before any rank failed.
    pub run_failed: Option<String>,
}

impl Attempt {
    /// The error a rank leaves the run with (empty if it succeeded).
    pub fn leave_error(&self, rank: usize) -> String {
        match (&self.statuses[rank], self.verdict.cause) {
            (Ok(s), _) if s.success() => String::new(),
            (Ok(s), Some(Cause::RankFailed(r))) if r == rank => describe(s),
            (Ok(s), Some(cause)) => format!("stopped by drove run {cause}: {}", describe(s)),
            (Ok(s), None) => describe(s),
            (Err(e), _) => e.clone(),
        }
    }

    /// Why this attempt failed, if it did (the coordinator's verdict first).
    pub fn failure(&self) -> Option<String> {
        match (&self.verdict.run_failed, self.verdict.first_failure) {
            (Some(why), _) => Some(why.clone()),
            (None, Some((rank, code))) => Some(format!("rank {rank} failed (exit code {code})")),
            (None, None) => None,
        }
    }
}

/// Starts `np` ranks of `command` and supervises them until every one has ended.
pub(crate) fn supervise(
    np: usize,
    command: &RankCommand<'_>,
    grace: Duration,
    console: &Arc<dyn Console>,
    tx: mpsc::Sender<Event>,
    rx: &mpsc::Receiver<Event>,
) -> Result<Attempt, LaunchError> {
    let (started, spawn_error) = spawn_world(np, command, console, &tx);
    drop(tx);
    let mut world = World::new(started, grace);
    if let Some(e) = &spawn_error {
        tracing::error!("{e}");
        let next = world.pids.len();
        world.stop(Cause::RankFailed(next));
    }
    world.wait(rx)?;
    world.drain_relays();
    if let Some(e) = spawn_error {
        return Err(e);
    }
    Ok(world.into_attempt())
}

/// The ranks of an attempt while they run.
struct World {
    pids: Vec<u32>,
    statuses: Vec<Option<Result<ExitStatus, String>>>,
    running: usize,
    grace: Duration,
    /// When the ranks still running after SIGTERM get SIGKILL.
    kill_at: Option<Instant>,
    verdict: Verdict,
    relays: usize,
    relays_done: mpsc::Receiver<()>,
}

impl World {
    fn new(started: Started, grace: Duration) -> Self {
        let n = started.pids.len();
        World {
            pids: started.pids,
            statuses: vec![None; n],
            running: n,
            grace,
            kill_at: None,
            verdict: Verdict::default(),
            relays: started.relays,
            relays_done: started.relays_done,
        }
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.statuses.len()).filter(|&r| self.statuses[r].is_none()).collect()
    }

    /// SIGTERM to every rank still running; SIGKILL follows after the grace.
    fn stop(&mut self, why: Cause) {
        self.verdict.cause = Some(why);
        let alive = self.alive();
        if !alive.is_empty() {
            tracing::info!("stopping ranks {alive:?} {why}: SIGTERM, SIGKILL after {:?}", self.grace);
        }
        for &r in &alive {
            signal_group(self.pids[r], libc::SIGTERM);
        }
        self.kill_at = Some(Instant::now() + self.grace);
    }

    fn kill_all(&mut self) {
        for r in self.alive() {
            signal_group(self.pids[r], libc::SIGKILL);
        }
        self.kill_at = None;
    }

    /// Handles events until no rank runs.
    fn wait(&mut self, rx: &mpsc::Receiver<Event>) -> Result<(), LaunchError> {
        while self.running > 0 {
            let event = match self.kill_at {
                Some(at) => match rx.recv_timeout(at.saturating_duration_since(Instant::now())) {
                    Ok(ev) => Some(ev),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return Err(LaunchError::LostTrack),
                },
                None => Some(rx.recv().map_err(|_| LaunchError::LostTrack)?),
            };
            match event {
                None => {
                    tracing::warn!(
                        "ranks {:?} still run {:?} after SIGTERM: sending SIGKILL",
                        self.alive(),
                        self.grace
                    );
                    self.kill_all();
                }
                Some(Event::Exited(rank, status)) => self.exited(rank, status),
                Some(Event::RunFailed(why)) => self.run_failed(why),
                Some(Event::Signal(sig)) => self.signalled(sig),
            }
        }
        Ok(())
    }

    fn exited(&mut self, rank: usize, status: std::io::Result<ExitStatus>) {
        self.running -= 1;
        let status = status.map_err(|e| format!("waiting for it failed: {e}"));
        let failed = match &status {
            Ok(s) if s.success() => None,
            Ok(s) => Some((exit_code(s), describe(s))),
            Err(e) => Some((1, e.clone())),
        };
        self.statuses[rank] = Some(status);
        let Some((code, what)) = failed else { return };
        if self.verdict.cause.is_none() {
            tracing::error!("rank {rank} {what}");
            self.verdict.first_failure = Some((rank, code));
            self.stop(Cause::RankFailed(rank));
        } else {
            tracing::info!("rank {rank} {what}");
        }
    }

    fn run_failed(&mut self, why: String) {
        if self.verdict.cause.is_none() {
            tracing::error!("the coordinator failed the run: {why}");
            self.verdict.run_failed = Some(why);
            self.stop(Cause::RunFailed);
        }
    }

    /// The first signal stops the world; a second skips the grace.
    fn signalled(&mut self, sig: i32) {
        if self.verdict.cause.is_none() {
            tracing::warn!("received {}", signal_name(sig));
            self.verdict.interrupted = Some(sig);
            self.stop(Cause::Signal(sig));
        } else {
            tracing::warn!("received {} while stopping the ranks: killing them now", signal_name(sig));
            self.verdict.interrupted.get_or_insert(sig);
            self.kill_all();
        }
    }

    /// Every rank has ended; their pipes close unless something they started
    /// still holds them. Waits for the relays to drain, but not for such strays.
    fn drain_relays(&self) {
        let drain_until = Instant::now() + Duration::from_secs(2);
        for _ in 0..self.relays {
            if self.relays_done.recv_timeout(drain_until.saturating_duration_since(Instant::now())).is_err() {
                tracing::warn!(
                    "a rank's output is still held open by a process it started; not waiting for it"
                );
                break;
            }
        }
    }

    fn into_attempt(self) -> Attempt {
        Attempt {
            statuses: self.statuses.into_iter().map(|s| s.expect("every rank ended")).collect(),
            verdict: self.verdict,
        }
    }
}

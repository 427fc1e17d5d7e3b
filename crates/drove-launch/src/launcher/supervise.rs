//! One attempt: start the world, wait for every rank to end, and stop the
//! world (SIGTERM, then SIGKILL after the grace) when a rank fails, the
//! coordinator fails the run, or the launcher is signalled. Waiting is
//! event-driven: one thread per rank reports on a channel, signals and the
//! coordinator's verdict arrive on the same channel; only the grace is a timeout.

use std::process::ExitStatus;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::error::LaunchError;
use crate::exit::{describe, exit_code, signal_name};
use crate::launcher::console::Console;
use crate::launcher::spawn::{RankCommand, Started, SupervisorEvent, signal_group, spawn_slot, spawn_world};

/// Why the ranks are being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// This rank failed first.
    RankFailed(usize),
    /// The launcher received this signal.
    Signal(i32),
    /// The coordinator failed the run.
    RunFailed,
    /// An elastic launch's slots that can still finish fell below its minimum
    /// with no restart left.
    BelowMinimum,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::RankFailed(r) => write!(f, "after rank {r} failed"),
            Cause::Signal(s) => write!(f, "on {}", signal_name(*s)),
            Cause::RunFailed => write!(f, "after the coordinator failed the run"),
            Cause::BelowMinimum => write!(f, "after too few ranks were left to form a world"),
        }
    }
}

/// How the ranks of one attempt ended.
#[derive(Debug)]
pub(crate) struct Attempt {
    /// Each rank's status (an error if waiting for it failed).
    pub statuses: Vec<Result<ExitStatus, String>>,
    /// Why it ended as it did.
    pub decision: Decision,
    /// An elastic launch's slots started again.
    pub restarts: u32,
}

/// What the supervisor decided while the ranks ran.
#[derive(Clone, Debug, Default)]
pub(crate) struct Decision {
    /// The first rank that failed on its own, with its exit code.
    pub first_failure: Option<(usize, u8)>,
    /// Why the ranks were stopped, if they were.
    pub cause: Option<Cause>,
    /// The signal that interrupted the launcher, if one did.
    pub interrupted: Option<i32>,
    /// Why the coordinator failed the run, if it did before any rank failed.
    pub run_failed: Option<String>,
    /// An elastic launch stopped because too few of its slots could still
    /// finish: (those that could, the minimum).
    pub below_minimum: Option<(usize, usize)>,
}

impl Attempt {
    /// The error a rank leaves the run with (empty if it succeeded).
    pub fn leave_error(&self, rank: usize) -> String {
        match (&self.statuses[rank], self.decision.cause) {
            (Ok(s), _) if s.success() => String::new(),
            (Ok(s), Some(Cause::RankFailed(r))) if r == rank => describe(s),
            (Ok(s), Some(cause)) => format!("stopped by drove run {cause}: {}", describe(s)),
            (Ok(s), None) => describe(s),
            (Err(e), _) => e.clone(),
        }
    }

    /// Why this attempt failed, if it did (the coordinator's verdict first).
    pub fn failure(&self) -> Option<String> {
        match (&self.decision.run_failed, self.decision.first_failure) {
            (Some(why), _) => Some(why.clone()),
            (None, Some((rank, code))) if let Some((left, min)) = self.decision.below_minimum => {
                Some(format!(
                    "rank {rank} failed (exit code {code}) with no restart left, and {left} rank(s) can still finish, \
                 fewer than --min-np {min}"
                ))
            }
            (None, Some((rank, code))) => Some(format!("rank {rank} failed (exit code {code})")),
            (None, None) => None,
        }
    }
}

/// An elastic launch's slots: a failed one is started again alone (the
/// others keep running), up to `max_restarts` in all; the launch succeeds if
/// at least `min` slots end with exit 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotPolicy {
    pub min: usize,
    pub max_restarts: u32,
}

/// What a failed slot is started again with.
struct Respawn<'a> {
    command: &'a RankCommand<'a>,
    console: &'a Arc<dyn Console>,
    events: mpsc::Sender<SupervisorEvent>,
    policy: SlotPolicy,
    /// Slots whose last process failed with no restart left, with its code.
    dropped: Vec<(usize, u8)>,
}

/// Starts `np` ranks of `command` and supervises them until every one has
/// ended; with `slots`, an elastic launch's.
pub(crate) fn supervise<'a>(
    np: usize,
    command: &'a RankCommand<'a>,
    grace: Duration,
    console: &'a Arc<dyn Console>,
    tx: mpsc::Sender<SupervisorEvent>,
    rx: &mpsc::Receiver<SupervisorEvent>,
    slots: Option<SlotPolicy>,
) -> Result<Attempt, LaunchError> {
    let (started, spawn_error) = spawn_world(np, command, console, &tx);
    let respawn =
        slots.map(|policy| Respawn { command, console, events: tx.clone(), policy, dropped: Vec::new() });
    drop(tx);
    let mut world = Slots::new(started, grace, respawn);
    if let Some(e) = &spawn_error {
        tracing::error!("{e}");
        let next = world.started.pids.len();
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
struct Slots<'a> {
    started: Started,
    statuses: Vec<Option<Result<ExitStatus, String>>>,
    running: usize,
    grace: Duration,
    /// When the ranks still running after SIGTERM get SIGKILL.
    kill_at: Option<Instant>,
    decision: Decision,
    /// An elastic launch's way to start a failed slot again.
    respawn: Option<Respawn<'a>>,
    /// Slots started again.
    restarts: u32,
}

impl<'a> Slots<'a> {
    fn new(started: Started, grace: Duration, respawn: Option<Respawn<'a>>) -> Self {
        let n = started.pids.len();
        Slots {
            started,
            statuses: vec![None; n],
            running: n,
            grace,
            kill_at: None,
            decision: Decision::default(),
            respawn,
            restarts: 0,
        }
    }

    fn alive(&self) -> Vec<usize> {
        (0..self.statuses.len()).filter(|&r| self.statuses[r].is_none()).collect()
    }

    /// SIGTERM to every rank still running; SIGKILL follows after the grace.
    fn stop(&mut self, why: Cause) {
        self.decision.cause = Some(why);
        let alive = self.alive();
        if !alive.is_empty() {
            tracing::info!("stopping ranks {alive:?} {why}: SIGTERM, SIGKILL after {:?}", self.grace);
        }
        for &r in &alive {
            signal_group(self.started.pids[r], libc::SIGTERM);
        }
        self.kill_at = Some(Instant::now() + self.grace);
    }

    fn kill_all(&mut self) {
        for r in self.alive() {
            signal_group(self.started.pids[r], libc::SIGKILL);
        }
        self.kill_at = None;
    }

    /// Handles events until no rank runs.
    fn wait(&mut self, rx: &mpsc::Receiver<SupervisorEvent>) -> Result<(), LaunchError> {
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
                Some(SupervisorEvent::Exited(rank, status)) => self.exited(rank, status),
                Some(SupervisorEvent::RunFailed(why)) => self.run_failed(why),
                Some(SupervisorEvent::Signal(sig)) => self.signalled(sig),
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
        if self.decision.cause.is_none() && self.respawn.is_some() {
            self.slot_failed(rank, code, &what);
        } else if self.decision.cause.is_none() {
            tracing::error!("rank {rank} {what}");
            self.decision.first_failure = Some((rank, code));
            self.stop(Cause::RankFailed(rank));
        } else {
            tracing::info!("rank {rank} {what}");
        }
    }

    /// An elastic launch's slot failed: start it again alone while restarts
    /// are left (the others keep running); else the others go on without it.
    fn slot_failed(&mut self, rank: usize, code: u8, what: &str) {
        let respawn = self.respawn.as_mut().expect("an elastic launch");
        let limit = respawn.policy.max_restarts;
        if self.restarts < limit {
            self.restarts += 1;
            tracing::warn!(
                "rank {rank} {what}: starting its slot again alone ({} of {limit} restarts)",
                self.restarts
            );
            let (command, console) = (respawn.command, respawn.console);
            match spawn_slot(rank, command, console, &respawn.events, &mut self.started) {
                Ok(()) => {
                    self.statuses[rank] = None;
                    self.running += 1;
                    return;
                }
                Err(e) => tracing::error!("cannot start slot {rank} again: {e}"),
            }
        } else {
            tracing::error!(
                "rank {rank} {what}: no restart left (--max-restarts {limit}); the others go on without it"
            );
        }
        respawn.dropped.push((rank, code));
        let min = respawn.policy.min;
        let finished = self.statuses.iter().filter(|s| matches!(s, Some(Ok(s)) if s.success())).count();
        let left = self.running + finished;
        if left < min {
            tracing::error!(
                "only {left} rank(s) can still finish, fewer than --min-np {min}, and no restart is left: \
                 stopping the run"
            );
            self.decision.first_failure = Some((rank, code));
            self.decision.below_minimum = Some((left, min));
            self.stop(Cause::BelowMinimum);
        }
    }

    fn run_failed(&mut self, why: String) {
        if self.decision.cause.is_none() {
            tracing::error!("the coordinator failed the run: {why}");
            self.decision.run_failed = Some(why);
            self.stop(Cause::RunFailed);
        }
    }

    /// The first signal stops the world; a second skips the grace.
    fn signalled(&mut self, sig: i32) {
        if self.decision.cause.is_none() {
            tracing::warn!("received {}", signal_name(sig));
            self.decision.interrupted = Some(sig);
            self.stop(Cause::Signal(sig));
        } else {
            tracing::warn!("received {} while stopping the ranks: killing them now", signal_name(sig));
            self.decision.interrupted.get_or_insert(sig);
            self.kill_all();
        }
    }

    /// Every rank has ended; their pipes close unless something they started
    /// still holds them. Waits for the relays to drain, but not for such strays.
    fn drain_relays(&self) {
        let drain_until = Instant::now() + Duration::from_secs(2);
        for _ in 0..self.started.relays {
            let left = drain_until.saturating_duration_since(Instant::now());
            if self.started.relays_done.recv_timeout(left).is_err() {
                tracing::warn!(
                    "a rank's output is still held open by a process it started; not waiting for it"
                );
                break;
            }
        }
    }

    fn into_attempt(self) -> Attempt {
        let statuses: Vec<_> = self.statuses.into_iter().map(|s| s.expect("every rank ended")).collect();
        let mut decision = self.decision;
        if let Some(respawn) = self.respawn {
            let succeeded = statuses.iter().filter(|s| s.as_ref().is_ok_and(ExitStatus::success)).count();
            if succeeded < respawn.policy.min {
                decision.first_failure = decision.first_failure.or(respawn.dropped.first().copied());
            } else if !respawn.dropped.is_empty() {
                tracing::warn!(
                    "slots {:?} failed for good; {succeeded} slots finished the run (at least {})",
                    respawn.dropped.iter().map(|d| d.0).collect::<Vec<_>>(),
                    respawn.policy.min
                );
            }
        }
        Attempt { statuses, decision, restarts: self.restarts }
    }
}

//! `drove train ner`'s hidden fault flags (tests of failure handling,
//! `--resume` and restarts), turned into drove-launch's [`Faults`], and the
//! observer that brings them on around the one that shows progress.

use std::time::Duration;

use anyhow::anyhow;
use clap::Args;
use drove_collective::fault::Trigger;
use drove_launch::fault::Faults;
use drove_ner::{DiagnoseReport, EvalReport, Gpu, Observer, ReformReport, StepReport};

/// The fault flags of `drove train ner`, all hidden.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("fault").args(["fail_at_step", "fail_in_backward"]).multiple(true)))]
pub struct FaultArgs {
    /// Make rank --rank-to-fail kill itself with SIGKILL right after step N (a
    /// test of failure handling, --resume and restarts; only in the first
    /// attempt: never when DROVE_RESTART_COUNT is above 0).
    #[arg(long, value_name = "N", hide = true)]
    fail_at_step: Option<u64>,
    /// Make rank --rank-to-fail kill itself with SIGKILL in the middle of
    /// its N-th step's backward pass: at the step's second gradient
    /// all-reduce, the first bucket averaged on every rank and the rest not
    /// (a test of a rank lost while buckets are in flight; with --no-overlap
    /// the buckets go after backward). Only in the first attempt.
    #[arg(long, value_name = "N", hide = true, value_parser = clap::value_parser!(u64).range(1..))]
    fail_in_backward: Option<u64>,
    /// The rank that --fail-at-step or --fail-in-backward kills (its rank in
    /// the first world of an elastic run).
    #[arg(long, value_name = "R", default_value_t = 0, hide = true, requires = "fault")]
    rank_to_fail: usize,
    /// Make rank --rank-to-stall stop for --stall-secs right after step N, its
    /// heartbeats going on (a test that a slow member is waited for, not
    /// lost; only in the first attempt).
    #[arg(long, value_name = "N", hide = true)]
    stall_at_step: Option<u64>,
    /// The rank that --stall-at-step stops.
    #[arg(long, value_name = "R", default_value_t = 0, hide = true, requires = "stall_at_step")]
    rank_to_stall: usize,
    /// How long --stall-at-step stops its rank.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, hide = true, requires = "stall_at_step")]
    stall_secs: f64,
    /// Destroy the wgpu device right after step N, as a driver reset would (a
    /// test that a device lost mid-run is an error naming it, not a panic).
    #[arg(long, value_name = "N", hide = true)]
    lose_device_at_step: Option<u64>,
}

impl FaultArgs {
    /// The faults asked for, in the attempt `restart_count` counts; `gpu`
    /// holds the device --lose-device-at-step destroys.
    pub fn faults(&self, restart_count: u32, gpu: Option<&Gpu>) -> anyhow::Result<Faults> {
        let mut faults = Faults::new(restart_count);
        if let Some(step) = self.fail_at_step {
            faults = faults.kill_after_step(step, self.rank_to_fail, "--fail-at-step");
        }
        if let Some(step) = self.fail_in_backward {
            // Each step starts with one `step.counts` all-reduce; the step's
            // second gradient op (`gradients.bucket...`) is, with the
            // all-reduce overlapped, in the middle of backward, the first
            // bucket averaged on every rank.
            let trigger = Trigger::named("gradients.*").nth(2).after(Trigger::named("step.counts").nth(step));
            let place = format!("in the backward pass of step {step}");
            faults = faults.kill_at_op(self.rank_to_fail, trigger, &place, "--fail-in-backward");
        }
        if let Some(step) = self.stall_at_step {
            let time = Duration::try_from_secs_f64(self.stall_secs).unwrap_or_default();
            faults = faults.stop_after_step(step, self.rank_to_stall, time, "--stall-at-step");
        }
        if let Some(step) = self.lose_device_at_step {
            faults = lose_device_after(faults, step, gpu)?;
        }
        Ok(faults)
    }
}

/// --lose-device-at-step: the wgpu device `gpu` holds, destroyed after `step`.
fn lose_device_after(faults: Faults, step: u64, gpu: Option<&Gpu>) -> anyhow::Result<Faults> {
    #[cfg(feature = "wgpu")]
    if let Some(adapter) = gpu.and_then(Gpu::adapter).cloned() {
        let destroy = move || adapter.destroy();
        return Ok(faults.run_after_step(step, "destroying the device", destroy, "--lose-device-at-step"));
    }
    let _ = (faults, step, gpu);
    Err(anyhow!("--lose-device-at-step needs --device wgpu"))
}

/// An observer with faults brought on right after each step, before the
/// step reaches `inner` (which, on a kill, is first asked to deliver what
/// it holds).
pub struct Faulted<O> {
    /// The observer the steps reach after the faults.
    pub inner: O,
    faults: Faults,
    /// This process's rank in its current world.
    rank: usize,
    /// Delivers what `inner` holds that must outlive a kill.
    before_kill: fn(&O),
}

impl<O> Faulted<O> {
    /// `inner`, on rank `rank`, with `faults`; `before_kill` delivers what
    /// `inner` holds that must outlive a kill (its metrics).
    pub fn new(inner: O, faults: Faults, rank: usize, before_kill: fn(&O)) -> Self {
        Faulted { inner, faults, rank, before_kill }
    }

    /// The faults (for the collective that kills at an op).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }
}

impl<O: Observer> Observer for Faulted<O> {
    fn started(&mut self, done: u64, total: u64) {
        self.inner.started(done, total);
    }

    fn step(&mut self, r: &StepReport) {
        let (inner, before_kill) = (&self.inner, self.before_kill);
        self.faults.after_step(r.step, self.rank, || before_kill(inner));
        self.inner.step(r);
    }

    fn evaluated(&mut self, r: &EvalReport) {
        self.inner.evaluated(r);
    }

    fn diagnosed(&mut self, r: &DiagnoseReport) {
        self.inner.diagnosed(r);
    }

    fn alarm(&mut self, r: &DiagnoseReport) {
        self.inner.alarm(r);
    }

    fn reformed(&mut self, r: &ReformReport) {
        self.rank = r.rank;
        self.inner.reformed(r);
    }

    fn note(&mut self, message: &str) {
        self.inner.note(message);
    }
}

//! An elastic run's loop: the steps over what is left of each epoch at the
//! current world, and the re-form when a member is lost or one waits to join.
//!
//! A step is applied only after its all-reduce succeeded, so a lost member
//! costs the one step whose collective failed: the survivors keep their
//! replica, join the next world, take the most advanced member's state
//! ([`drove_train::Replica::resync`]) and re-shard the rest of the epoch from
//! the position it reached. The interrupted step's samples are redone by the
//! new world; nothing applied is rolled back.

use std::time::Instant;

use burn::tensor::backend::AutodiffBackend;
use drove_collective::{CommError, Elastic, Loss, ReformCause, World};
use drove_train::TrainError;
use drove_train::timeline::Track;

use super::Fit;
use crate::data::training_loader;
use crate::{NerError, ReformReport};

/// Why a world's steps over an epoch stopped.
enum Stop {
    /// Every position of the epoch is applied.
    EpochDone,
    /// `--max-steps` in this process.
    MaxSteps,
    /// A member waits to join: re-form at this step boundary.
    Reform(ReformCause),
}

/// The cause of a re-form if `e` says a member of `elastic`'s world is gone; else `e`.
fn loss_of(elastic: &dyn Elastic, e: NerError) -> Result<ReformCause, NerError> {
    match membership_loss(&e) {
        Some(comm) => Ok(ReformCause::of_error(comm, &elastic.world())),
        None => Err(e),
    }
}

/// The collective error inside `e`, if it says a member of the world is gone.
fn membership_loss(e: &NerError) -> Option<&CommError> {
    let comm = match e {
        NerError::Comm(c) | NerError::Train(TrainError::Comm(c)) => c,
        _ => return None,
    };
    comm.is_membership_loss().then_some(comm)
}

impl<B: AutodiffBackend> Fit<'_, '_, B> {
    /// The first world: every member takes one state (the root's initial
    /// weights, or the most advanced member's when it joins a world that
    /// already trains).
    pub(super) fn join_world(&mut self, elastic: &dyn Elastic) -> Result<(), NerError> {
        self.resync(elastic, "joined the run", Instant::now())
    }

    /// The epochs from where the loop stands, re-forming the world whenever a
    /// member is lost or one waits to join.
    pub(super) fn run_elastic(&mut self, elastic: &dyn Elastic) -> Result<(), NerError> {
        let mut steps_here = 0u64;
        while self.state.epoch < self.opts.epochs {
            let cause = match self.world_steps(elastic, &mut steps_here) {
                Ok(Stop::EpochDone) => match self.end_epoch() {
                    Ok(()) => continue,
                    Err(e) => loss_of(elastic, e)?,
                },
                Ok(Stop::MaxSteps) => break,
                Ok(Stop::Reform(cause)) => cause,
                Err(e) => loss_of(elastic, e)?,
            };
            self.reform(elastic, cause)?;
        }
        Ok(())
    }

    /// This world's steps over the rest of the epoch, from its position.
    fn world_steps(&mut self, elastic: &dyn Elastic, steps_here: &mut u64) -> Result<Stop, NerError> {
        let comm = self.replica.comm();
        let (rank, world) = (comm.rank(), comm.world_size());
        self.loader_start = self.state.position;
        let loader = training_loader(self.opts, self.data, rank, world, self.loader_start)?;
        let every = self.opts.reform_check_every.max(1) as u64;
        for (b, batch) in loader.epoch(self.state.epoch as u64).enumerate() {
            let batch = batch?;
            if self.opts.max_steps.is_some_and(|m| *steps_here >= m) {
                return Ok(Stop::MaxSteps);
            }
            self.step(b, &batch)?;
            *steps_here += 1;
            if self.state.global_step.is_multiple_of(every) && elastic.reform_wanted()? {
                return Ok(Stop::Reform(ReformCause {
                    kind: Loss::MemberAdded,
                    members: Vec::new(),
                    detail: format!("a member waits to join (seen at step {})", self.state.global_step),
                }));
            }
        }
        Ok(Stop::EpochDone)
    }

    /// Ends this world and joins the next; again if a member is lost while
    /// the new world takes one state.
    fn reform(&mut self, elastic: &dyn Elastic, mut cause: ReformCause) -> Result<(), NerError> {
        let started = Instant::now();
        loop {
            let last = elastic.world();
            if let Err(e) = elastic.reform(self.replica.steps(), &cause) {
                self.checkpoint_alone(&last, &e);
                return Err(e.into());
            }
            match self.resync(elastic, &cause.to_string(), started) {
                Ok(()) => {
                    let generation = elastic.world().generation;
                    self.timeline.record(
                        format!("re-form: generation {generation}"),
                        "phase",
                        Track::Main,
                        started,
                    );
                    return Ok(());
                }
                Err(e) => cause = loss_of(elastic, e)?,
            }
        }
    }

    /// The next world did not form (below MIN, or this member was left
    /// out): rank 0 of the last world writes a checkpoint on its own, so the
    /// run can be resumed (`--resume`) from where it stood.
    fn checkpoint_alone(&mut self, last: &World, error: &CommError) {
        if last.place.rank().get() != 0 || matches!(error, CommError::LeftOut(_)) {
            return;
        }
        match self.replica.save_alone(&self.root, &self.state, 2) {
            Ok(dir) => {
                self.observer.note(&format!("the world could not re-form; checkpoint {}", dir.display()));
                self.last_checkpoint = Some(dir);
            }
            Err(e) => self
                .observer
                .note(&format!("the world could not re-form, nor the checkpoint be written: {e}")),
        }
    }

    /// Every member of the new world takes the most advanced member's state
    /// and the loop's position with it.
    fn resync(&mut self, elastic: &dyn Elastic, cause: &str, started: Instant) -> Result<(), NerError> {
        let s = &self.state;
        let mut words = [s.epoch as u64, s.position as u64, s.global_step, s.batch as u64];
        let resynced = self.replica.resync(&mut words)?;
        let [epoch, position, global_step, batch] = words;
        (self.state.epoch, self.state.position) = (epoch as usize, position as usize);
        (self.state.global_step, self.state.batch) = (global_step, batch as usize);
        let world = elastic.world();
        let report = ReformReport {
            generation: world.generation,
            rank: world.place.rank().get(),
            world_size: world.place.world().get(),
            step: resynced.step,
            source: resynced.source,
            behind: resynced.behind,
            fingerprint: resynced.fingerprint,
            cause: cause.to_string(),
            seconds: started.elapsed().as_secs_f64(),
        };
        self.observer.reformed(&report);
        self.observer.note(&format!(
            "generation {}: rank {} of {} from step {} (epoch {}, {} samples of it applied; state from rank {}) \
             after {:.1} s: {}",
            report.generation,
            report.rank,
            report.world_size,
            report.step,
            self.state.epoch + 1,
            self.state.position,
            report.source,
            report.seconds,
            report.cause
        ));
        Ok(())
    }
}

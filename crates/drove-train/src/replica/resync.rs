//! After an elastic world re-formed: every member takes the state of the most
//! advanced one, with no commit copies and nothing rolled back.
//!
//! A step is applied only after its all-reduce succeeded, so the members at
//! the highest step hold the same parameters and moments (their fingerprints
//! must agree, or every member fails naming them); one of them broadcasts
//! parameters, moments, the optimizer's step (the schedule's position) and the
//! caller's loop state to every member behind it, new joiners included.

use std::time::Duration;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use drove_collective::{Buffer, Collective, Element};

use super::{Replica, ReplicaOptions, fingerprint};
use crate::TrainError;
use crate::flat::{FlatAdamW, FlatParams};
use crate::placement::Reset;

/// What a [`Replica::resync`] found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resynced {
    /// The member whose state every other took (the lowest rank at the
    /// highest step; the broadcast root of a fresh start).
    pub source: usize,
    /// The optimizer step every member is at now.
    pub step: u64,
    /// The ranks that were behind (or new) and received the state.
    pub behind: Vec<usize>,
    /// The fingerprint of parameters, moments and step every member holds.
    pub fingerprint: u64,
}

impl<'c, B: AutodiffBackend, M: AutodiffModule<B>> Replica<'c, B, M> {
    /// Makes `model` this member's replica without the start's broadcast: for
    /// a member entering a world whose others already train (an elastic
    /// run's joiner), which then calls [`Replica::resync`] with them.
    pub fn joining(
        model: M,
        comm: &'c dyn Collective,
        options: ReplicaOptions,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        options.check(comm.world_size())?;
        let params = FlatParams::read(&model)?;
        Self::assemble(model, params, comm, options, device)
    }

    /// Brings every member of the (re-formed) world to the state of the most
    /// advanced one: drops this step's pending gradients, all-gathers every
    /// member's (optimizer step, fingerprint), checks that the members at the
    /// highest step agree, and broadcasts parameters, moments, the step and
    /// `loop_state` (the caller's position, e.g. epoch and samples applied)
    /// from the lowest of them to every member, if any is behind. When every
    /// member is at step 0 (a fresh start), the options' root broadcasts its
    /// parameters, as [`Replica::new`] does. Every member calls this at once.
    pub fn resync(&mut self, loop_state: &mut [u64]) -> Result<Resynced, TrainError> {
        self.placement.reset(Reset::Gradients);
        self.pending = None;
        (self.passes, self.local_loss, self.compute) = (0, 0.0, Duration::ZERO);
        self.deferred_loss.clear();
        let (params, optim) = {
            let (p, o) = self.placement.host_state(self.model())?;
            (p.into_owned(), o.into_owned())
        };
        let print = fingerprint(&params, &optim);
        let mine = [optim.step as i64, print as i64];
        let gathered = self.comm.all_gather("resync.state", &[2], i64::tensor_ref(&mine))?;
        let Buffer::I64(all) = gathered.data else { unreachable!("gathered i64") };
        let states: Vec<(u64, u64)> = all.chunks(2).map(|c| (c[0] as u64, c[1] as u64)).collect();
        let plan = Handover::of(&states, self.options.root)?;
        let mut words: Vec<i64> = loop_state.iter().map(|&w| w as i64).collect();
        self.comm.broadcast("resync.loop", &[words.len()], i64::tensor_mut(&mut words), plan.source)?;
        for (w, got) in loop_state.iter_mut().zip(&words) {
            *w = *got as u64;
        }
        if plan.behind.is_empty() {
            return Ok(plan.resynced(print));
        }
        let (params, optim) = self.receive_state(params, optim, plan.source)?;
        let print = fingerprint(&params, &optim);
        let model = self.model.take().expect("the model is always put back");
        self.model = Some(params.write(model, &self.device));
        self.placement.reset(Reset::State(params, optim));
        Ok(plan.resynced(print))
    }

    /// Parameters, moments and step from `source` (which sends its own).
    fn receive_state(
        &self,
        mut params: FlatParams,
        mut optim: FlatAdamW,
        source: usize,
    ) -> Result<(FlatParams, FlatAdamW), TrainError> {
        crate::exchange::broadcast_flat(&mut params, self.comm, source)?;
        for (index, (m, v)) in optim.m.iter_mut().zip(optim.v.iter_mut()).enumerate() {
            let shape = [m.len()];
            self.comm.broadcast(&format!("resync.m.{index}"), &shape, f32::tensor_mut(m), source)?;
            self.comm.broadcast(&format!("resync.v.{index}"), &shape, f32::tensor_mut(v), source)?;
        }
        let mut step = [optim.step as i64];
        self.comm.broadcast("resync.step", &[1], i64::tensor_mut(&mut step), source)?;
        optim.step = step[0] as u64;
        Ok((params, optim))
    }
}

/// Who sends and who receives, from every member's (step, fingerprint).
#[derive(Debug, PartialEq, Eq)]
struct Handover {
    source: usize,
    step: u64,
    behind: Vec<usize>,
}

impl Handover {
    fn of(states: &[(u64, u64)], root: usize) -> Result<Handover, TrainError> {
        let step = states.iter().map(|s| s.0).max().unwrap_or(0);
        if step == 0 {
            // A fresh start: the root's initial weights, as Replica::new.
            let behind = (0..states.len()).filter(|&r| r != root).collect();
            return Ok(Handover { source: root.min(states.len().saturating_sub(1)), step, behind });
        }
        let ahead: Vec<usize> = (0..states.len()).filter(|&r| states[r].0 == step).collect();
        let source = ahead[0];
        let odd: Vec<usize> = ahead.iter().copied().filter(|&r| states[r].1 != states[source].1).collect();
        if !odd.is_empty() {
            return Err(TrainError::Disagree(format!(
                "after the world re-formed, rank(s) {ahead:?} are at step {step} but rank(s) {odd:?} hold \
                 other parameters or optimizer state than rank {source} (fingerprints {})",
                states.iter().map(|s| format!("{:016x}", s.1)).collect::<Vec<_>>().join(", ")
            )));
        }
        let behind = (0..states.len()).filter(|&r| states[r].0 != step).collect();
        Ok(Handover { source, step, behind })
    }

    fn resynced(self, fingerprint: u64) -> Resynced {
        Resynced { source: self.source, step: self.step, behind: self.behind, fingerprint }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_member_at_the_highest_step_sends_to_those_behind() {
        let plan = Handover::of(&[(9, 1), (10, 7), (10, 7), (0, 3)], 0).unwrap();
        assert_eq!(plan, Handover { source: 1, step: 10, behind: vec![0, 3] });
        let even = Handover::of(&[(10, 7), (10, 7)], 0).unwrap();
        assert!(even.behind.is_empty());
    }

    #[test]
    fn a_fresh_start_broadcasts_from_the_root_and_disagreeing_leaders_are_named() {
        assert_eq!(
            Handover::of(&[(0, 1), (0, 2), (0, 3)], 1).unwrap(),
            Handover { source: 1, step: 0, behind: vec![0, 2] }
        );
        let err = Handover::of(&[(10, 7), (4, 1), (10, 8)], 0).unwrap_err().to_string();
        assert!(err.contains("rank(s) [0, 2] are at step 10 but rank(s) [2]"), "{err}");
    }
}

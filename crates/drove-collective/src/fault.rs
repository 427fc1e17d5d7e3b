//! Faults on demand, for tests of what a trainer does when a rank is lost in
//! the middle of a step.
//!
//! [`Faulty`] wraps any [`Collective`] (one rank's: a [`LocalWorld`] rank, a
//! process's communicator) and, at the op its [`Trigger`] names, loses the
//! rank: that op and every later one fail with [`CommError::PeerLost`] naming
//! the op and this rank, as a transport names a peer whose process died. An
//! action runs once when it strikes, so the rank's peers see it too:
//! [`LocalWorld::hang_up`] (they fail at once, naming it) or a `SIGKILL` of
//! the process. Ops are counted as the caller issues them, by name, so a test
//! says *where* in a step a rank is lost ("the second gradient bucket of the
//! fifth step") in the names a trainer gives its ops, through the public seam
//! alone, whatever the trainer's internals.
//!
//! ```
//! use drove_collective::fault::{Faulty, Trigger};
//! use drove_collective::{Collective, CommError, Element, LocalWorld, ReduceOptions};
//!
//! let ranks = LocalWorld::new(2)?;
//! // Rank 1 is lost at its second op named "grad".
//! let lost = Faulty::new(&ranks[1], Trigger::named("grad").nth(2)).on_strike(|c, _| c.hang_up());
//! let run = |comm: &dyn Collective| {
//!     let mut x = [1.0f32];
//!     (0..2)
//!         .map(|_| comm.all_reduce("grad", &[1], f32::tensor_mut(&mut x), ReduceOptions::sum()))
//!         .find_map(Result::err)
//! };
//! let errors = std::thread::scope(|s| {
//!     let a = s.spawn(|| run(&ranks[0]));
//!     let b = s.spawn(|| run(&lost));
//!     [a.join().unwrap(), b.join().unwrap()]
//! });
//! for e in errors {
//!     // Both ranks: the second all-reduce, rank 1 lost.
//!     let Some(CommError::PeerLost { op, ranks, .. }) = e else { panic!("{e:?}") };
//!     assert_eq!((op.as_str(), ranks), ("all_reduce \"grad\"", vec![1]));
//! }
//! # Ok::<(), CommError>(())
//! ```
//!
//! [`LocalWorld`]: crate::LocalWorld
//! [`LocalWorld::hang_up`]: crate::LocalWorld::hang_up

use std::fmt::{self, Display};
use std::sync::{Mutex, MutexGuard};

use crate::collective::{Collective, Gathered, Pending};
use crate::dtype::{Buffer, TensorMut, TensorRef};
use crate::elastic::{Elastic, ReformCause, World, WorldRange};
use crate::error::CommError;
use crate::op::{OpDesc, OpKind, ReduceOptions};

/// Which op a [`Faulty`] collective strikes at: a sequence of stages, each
/// the `n`th op (counted from 1) matching a name pattern, or any op; each
/// stage counts the ops after the one the previous stage ended at, and the
/// op that ends the last stage is the one struck.
///
/// A pattern is an op's name (`"step.loss"`, `"gradients.bucket3"`), or a
/// prefix followed by `*` (`"gradients.*"`: every bucket of the gradient
/// all-reduce, its row-sparse gathers included).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    stages: Vec<Stage>,
}

/// One stage of a [`Trigger`]: the `nth` op whose name `pattern` matches
/// (any op when `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stage {
    pattern: Option<String>,
    nth: u64,
}

impl Stage {
    fn matches(&self, name: &str) -> bool {
        match self.pattern.as_deref() {
            None => true,
            Some(p) => match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == p,
            },
        }
    }
}

impl Trigger {
    /// This rank's `n`th op, whatever it is (counted from 1; 0 is taken as 1).
    pub fn nth_op(n: u64) -> Trigger {
        Trigger { stages: vec![Stage { pattern: None, nth: n.max(1) }] }
    }

    /// The first op whose name `pattern` matches (a name, or a prefix and `*`).
    pub fn named(pattern: &str) -> Trigger {
        Trigger { stages: vec![Stage { pattern: Some(pattern.to_string()), nth: 1 }] }
    }

    /// The `n`th op (counted from 1; 0 is taken as 1) that this trigger's
    /// last stage matches, instead of the first.
    pub fn nth(mut self, n: u64) -> Trigger {
        if let Some(last) = self.stages.last_mut() {
            last.nth = n.max(1);
        }
        self
    }

    /// This trigger, counting only the ops after the one `earlier` strikes
    /// at: `Trigger::named("gradients.*").nth(2).after(Trigger::named("step.counts").nth(5))`
    /// is the second gradient op after the fifth `step.counts`.
    pub fn after(self, earlier: Trigger) -> Trigger {
        Trigger { stages: earlier.stages.into_iter().chain(self.stages).collect() }
    }
}

impl Display for Trigger {
    /// E.g. `op #3`, or `"gradients.*" #2 after "step.counts" #5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, stage) in self.stages.iter().rev().enumerate() {
            if i > 0 {
                f.write_str(" after ")?;
            }
            match &stage.pattern {
                None => write!(f, "op #{}", stage.nth)?,
                Some(p) => write!(f, "{p:?} #{}", stage.nth)?,
            }
        }
        Ok(())
    }
}

/// Where a [`Faulty`] collective stands: the stage being counted, its count,
/// the ops seen, and the op it struck at.
#[derive(Debug, Default)]
struct FaultState {
    stage: usize,
    count: u64,
    ops: u64,
    struck: Option<String>,
}

/// What runs once when a [`Faulty`] collective strikes: given the wrapped
/// collective and the op's label.
type Action<'a, C> = Box<dyn Fn(&C, &str) + Send + Sync + 'a>;

/// One rank's collective that is lost at the op its [`Trigger`] names (see
/// the [module](self)); until then every op goes to the wrapped collective
/// as it is. An [`Elastic`] collective stays one: its world's methods go
/// through uncounted.
pub struct Faulty<'a, C: Collective + ?Sized> {
    inner: &'a C,
    trigger: Trigger,
    progress: Mutex<FaultState>,
    on_strike: Option<Action<'a, C>>,
}

impl<'a, C: Collective + ?Sized> Faulty<'a, C> {
    /// `inner`, lost at the op `trigger` names.
    pub fn new(inner: &'a C, trigger: Trigger) -> Self {
        Faulty { inner, trigger, progress: Mutex::new(FaultState::default()), on_strike: None }
    }

    /// Runs `action(inner, op)` once when the fault strikes, before the op
    /// fails: what makes the loss visible to the peers, e.g.
    /// `|c, _| c.hang_up()` on a [`LocalWorld`](crate::LocalWorld) rank, or
    /// a `SIGKILL` of the process.
    pub fn on_strike(mut self, action: impl Fn(&C, &str) + Send + Sync + 'a) -> Self {
        self.on_strike = Some(Box::new(action));
        self
    }

    /// The wrapped collective.
    pub fn inner(&self) -> &'a C {
        self.inner
    }

    /// The trigger.
    pub fn trigger(&self) -> &Trigger {
        &self.trigger
    }

    /// The op it struck at (its label, e.g. `all_reduce "gradients.bucket2"`),
    /// once it has.
    pub fn struck(&self) -> Option<String> {
        self.lock().struck.clone()
    }

    /// The ops this rank has issued through it, the one struck at included.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the op `kind` named `name`; the error of a lost rank, naming
    /// the op, if the fault strikes at it or struck before.
    fn count(&self, kind: OpKind, name: &str) -> Result<(), CommError> {
        let label = &format!("{kind} {name:?}");
        let rank = self.inner.rank();
        let mut p = self.lock();
        p.ops += 1;
        if let Some(at) = &p.struck {
            let detail = format!("rank {rank} was lost at {at} (a fault injected at {})", self.trigger);
            return Err(CommError::PeerLost { op: label.to_string(), ranks: vec![rank], detail });
        }
        let stage = &self.trigger.stages[p.stage];
        if !stage.matches(name) {
            return Ok(());
        }
        p.count += 1;
        if p.count < stage.nth {
            return Ok(());
        }
        (p.stage, p.count) = (p.stage + 1, 0);
        if p.stage < self.trigger.stages.len() {
            return Ok(());
        }
        p.struck = Some(label.to_string());
        let ops = p.ops;
        drop(p);
        if let Some(action) = &self.on_strike {
            action(self.inner, label);
        }
        let detail = format!("rank {rank} lost here, its op #{ops} (a fault injected at {})", self.trigger);
        Err(CommError::PeerLost { op: label.to_string(), ranks: vec![rank], detail })
    }
}

/// Every op is counted, then run on the wrapped collective unless the fault
/// strikes at it or struck before.
impl<C: Collective + ?Sized> Collective for Faulty<'_, C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn transport(&self) -> &'static str {
        self.inner.transport()
    }

    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        self.count(OpKind::AllReduce, name)?;
        self.inner.all_reduce(name, shape, data, opts)
    }

    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        self.count(OpKind::Broadcast, name)?;
        self.inner.broadcast(name, shape, data, root)
    }

    fn all_gather(&self, name: &str, shape: &[usize], data: TensorRef<'_>) -> Result<Gathered, CommError> {
        self.count(OpKind::AllGather, name)?;
        self.inner.all_gather(name, shape, data)
    }

    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<Gathered, CommError> {
        self.count(OpKind::ReduceScatter, name)?;
        self.inner.reduce_scatter(name, shape, data, opts)
    }

    fn barrier(&self, name: &str) -> Result<(), CommError> {
        self.count(OpKind::Barrier, name)?;
        self.inner.barrier(name)
    }

    fn agree(&self, desc: &OpDesc) -> Result<(), CommError> {
        self.count(desc.kind, &desc.name)?;
        self.inner.agree(desc)
    }

    fn all_reduce_async(
        &self,
        name: &str,
        shape: &[usize],
        data: Buffer,
        opts: ReduceOptions,
    ) -> Pending<Buffer> {
        match self.count(OpKind::AllReduce, name) {
            Ok(()) => self.inner.all_reduce_async(name, shape, data, opts),
            Err(e) => Pending::ready(Err(e)),
        }
    }

    fn broadcast_async(&self, name: &str, shape: &[usize], data: Buffer, root: usize) -> Pending<Buffer> {
        match self.count(OpKind::Broadcast, name) {
            Ok(()) => self.inner.broadcast_async(name, shape, data, root),
            Err(e) => Pending::ready(Err(e)),
        }
    }
}

impl<C: Elastic + ?Sized> Elastic for Faulty<'_, C> {
    fn world(&self) -> World {
        self.inner.world()
    }

    fn range(&self) -> WorldRange {
        self.inner.range()
    }

    fn reform_wanted(&self) -> Result<bool, CommError> {
        self.inner.reform_wanted()
    }

    fn reform(&self, step: u64, cause: &ReformCause) -> Result<World, CommError> {
        self.inner.reform(step, cause)
    }

    fn leave(&self, step: u64, error: Option<&str>) -> Result<(), CommError> {
        self.inner.leave(step, error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Element, LocalWorld, SingleProcess};

    /// Runs the ops named `names` (barriers) on `comm` until one fails:
    /// the index and error of that one.
    fn first_failure(comm: &dyn Collective, names: &[&str]) -> Option<(usize, CommError)> {
        names.iter().enumerate().find_map(|(i, name)| comm.barrier(name).err().map(|e| (i, e)))
    }

    #[test]
    fn a_trigger_strikes_at_the_op_it_names_and_every_later_op_fails() {
        let names = ["a", "step.counts", "g.1", "g.2", "step.counts", "g.1", "g.2", "g.3", "b"];
        let cases = [
            (Trigger::nth_op(3), 2),
            (Trigger::named("g.2"), 3),
            (Trigger::named("g.*").nth(4), 6),
            (Trigger::named("g.*").nth(2).after(Trigger::named("step.counts").nth(2)), 6),
            (Trigger::named("g.*").after(Trigger::named("step.counts")), 2),
            (Trigger::nth_op(0), 0),
        ];
        for (trigger, at) in cases {
            let what = trigger.to_string();
            let faulty = Faulty::new(&SingleProcess, trigger);
            let (i, e) = first_failure(&faulty, &names).unwrap_or_else(|| panic!("{what}: never struck"));
            assert_eq!(i, at, "{what}");
            let label = format!("barrier {:?}", names[at]);
            assert_eq!(faulty.struck().as_deref(), Some(label.as_str()), "{what}");
            let CommError::PeerLost { op, ranks, detail } = e else { panic!("{what}: {e}") };
            assert_eq!((op, ranks), (label.clone(), vec![0]), "{what}");
            assert!(detail.contains(&what), "{what}: the detail names the trigger: {detail}");
            // Lost for good: the next op fails too, naming itself and the first.
            let e = faulty.barrier("later").unwrap_err().to_string();
            assert!(e.contains("barrier \"later\"") && e.contains(&label), "{what}: {e}");
            assert_eq!(faulty.ops(), at as u64 + 2, "{what}");
        }
        let never = Faulty::new(&SingleProcess, Trigger::named("missing"));
        assert!(first_failure(&never, &names).is_none());
        assert_eq!(never.struck(), None);
        assert_eq!(
            Trigger::named("g.*").nth(2).after(Trigger::named("step.counts").nth(5)).to_string(),
            "\"g.*\" #2 after \"step.counts\" #5"
        );
    }

    #[test]
    fn a_rank_lost_in_a_local_world_fails_its_peers_at_once_naming_it() {
        // A deadline no test waits for: the peers fail when it hangs up.
        let ranks = LocalWorld::with_timeout(3, std::time::Duration::from_secs(600)).unwrap();
        let lost = Faulty::new(&ranks[2], Trigger::named("grad").nth(2)).on_strike(|c, _| c.hang_up());
        let comms: [&dyn Collective; 3] = [&ranks[0], &ranks[1], &lost];
        let out: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .map(|comm| {
                    s.spawn(move || {
                        let mut sums = Vec::new();
                        for _ in 0..3 {
                            let mut x = [1.0f32];
                            let opts = ReduceOptions::sum();
                            match comm.all_reduce("grad", &[1], f32::tensor_mut(&mut x), opts) {
                                Ok(()) => sums.push(x[0]),
                                Err(e) => return (sums, e),
                            }
                        }
                        panic!("rank {}: no op failed", comm.rank())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, (sums, e)) in out.into_iter().enumerate() {
            assert_eq!(sums, [3.0], "rank {rank}: the first all-reduce, of 3 ranks");
            let CommError::PeerLost { op, ranks, .. } = &e else { panic!("rank {rank}: {e}") };
            assert_eq!((op.as_str(), ranks.as_slice()), ("all_reduce \"grad\"", &[2][..]), "rank {rank}");
            assert!(e.is_membership_loss());
        }
        // The world stays without it: a later op fails the same way.
        let e = ranks[0].barrier("after").unwrap_err().to_string();
        assert!(e.contains("barrier \"after\": lost rank(s) [2]"), "{e}");
    }
}

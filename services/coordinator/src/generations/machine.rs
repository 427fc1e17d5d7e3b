//! The state machine of an elastic run: [`Generations`] and every transition
//! between its generations (joins, closing, heartbeats, the watchdog,
//! leaves), with no I/O.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use drove_proto::v1;

use super::{
    Generation, GenerationEnding, GenerationError, GenerationState, Heard, LastBeat, Member, MemberJoin,
};
use crate::run_state::RunState;

/// A member lost in this many of its generations in a row is left out of
/// the run's later ones ([`GenerationError::Excluded`]), as Horovod Elastic
/// blacklists a failing host: a machine that keeps dying costs the others a
/// re-form each time.
pub const MAX_LOSSES_IN_A_ROW: usize = 3;

/// An elastic run: its sizes and generations, oldest first.
#[derive(Debug)]
pub struct Generations {
    /// Run.
    pub run_id: String,
    /// The fewest members a generation starts with.
    pub min: usize,
    /// The most members a generation takes.
    pub max: usize,
    /// Oldest first; numbered 1, 2, ... in order.
    pub generations: Vec<Generation>,
    /// Each member's last heartbeat, and the generation it said it was in
    /// (a member waiting to join still beats for its old one).
    pub beats: HashMap<String, LastBeat>,
    /// Generations changed since the last [`Generations::take_changed`].
    changed: BTreeSet<i64>,
}

impl Generations {
    /// A run of no generations yet, taking `min..=max` members.
    pub fn new(run_id: &str, min: usize, max: usize) -> Generations {
        Generations {
            run_id: run_id.to_string(),
            min,
            max,
            generations: Vec::new(),
            beats: HashMap::new(),
            changed: BTreeSet::new(),
        }
    }

    /// A run resumed from the store: a forming generation's settle time
    /// counts from `now`.
    pub fn resume(
        run_id: &str,
        min: usize,
        max: usize,
        mut generations: Vec<Generation>,
        now: Instant,
    ) -> Generations {
        for g in &mut generations {
            g.last_join = now;
        }
        Generations { generations, ..Generations::new(run_id, min, max) }
    }

    /// The newest generation's number (0: none).
    pub fn newest(&self) -> i64 {
        self.generations.last().map_or(0, |g| g.number)
    }

    /// Generation `number`.
    pub fn generation(&self, number: i64) -> Option<&Generation> {
        usize::try_from(number - 1).ok().and_then(|i| self.generations.get(i))
    }

    fn generation_mut(&mut self, number: i64) -> Option<&mut Generation> {
        usize::try_from(number - 1).ok().and_then(|i| self.generations.get_mut(i))
    }

    fn forming_mut(&mut self) -> Option<&mut Generation> {
        self.generations.last_mut().filter(|g| g.state == GenerationState::Forming)
    }

    /// The forming generation, if any (always the newest).
    pub fn forming(&self) -> Option<&Generation> {
        self.generations.last().filter(|g| g.state == GenerationState::Forming)
    }

    /// The running generation, if any (at most one runs).
    pub fn running(&self) -> Option<&Generation> {
        self.generations.iter().rev().find(|g| g.state == GenerationState::Running)
    }

    /// How the run ended, if it did: its newest generation ended finished or failed.
    pub fn outcome(&self) -> Option<RunState> {
        let last = self.generations.last().filter(|g| g.state == GenerationState::Ended)?;
        match last.end.as_ref().map(|e| e.kind) {
            Some(v1::EndKind::Finished) => Some(RunState::Finished),
            Some(v1::EndKind::Failed) => Some(RunState::Failed),
            _ => None,
        }
    }

    /// Why the run failed, if it did.
    pub fn failure(&self) -> Option<&GenerationEnding> {
        let end = self.generations.last()?.end.as_ref()?;
        (end.kind == v1::EndKind::Failed).then_some(end)
    }

    /// The run's state as the runs table shows it: ended as its outcome,
    /// running while its newest generation runs, else rendezvous.
    pub fn run_state(&self) -> RunState {
        match (self.outcome(), self.generations.last().map(|g| g.state)) {
            (Some(outcome), _) => outcome,
            (None, Some(GenerationState::Running)) => RunState::Running,
            _ => RunState::Rendezvous,
        }
    }

    /// The world the runs table shows: the running generation's size, else
    /// the newest one's members so far.
    pub fn world(&self) -> usize {
        self.running().or(self.generations.last()).map_or(0, Generation::world_size)
    }

    /// The generations changed since the last call, to be stored.
    pub fn take_changed(&mut self) -> Vec<&Generation> {
        let numbers = std::mem::take(&mut self.changed);
        numbers.into_iter().filter_map(|n| self.generation(n)).collect()
    }

    fn touch(&mut self, number: i64) {
        self.changed.insert(number);
    }

    /// The forming generation, opened (numbered after the newest) if none is.
    fn open_forming(&mut self, now: Instant) -> &mut Generation {
        if self.forming().is_none() {
            let number = self.newest() + 1;
            self.generations.push(Generation::forming(number, now));
            self.touch(number);
        }
        self.forming_mut().expect("a forming generation was just opened")
    }
}

/// Joins.
impl Generations {
    /// Admits a join to the forming generation (opened if none is); returns
    /// its number. A member of the running generation re-joining ends it
    /// (with the join's cause); one joining it from outside (a newcomer, or a
    /// replacement) leaves it running, naming itself in its `reform` cause.
    pub fn join(&mut self, j: &MemberJoin, now: Instant, now_ms: i64) -> Result<i64, GenerationError> {
        self.check_join(j)?;
        if let Some(f) = self.forming()
            && let Some(m) = f.member(&j.member_id)
        {
            if m.address == j.address {
                return Ok(f.number); // a retry: idempotent
            }
            return Err(GenerationError::AlreadyIn {
                run: self.run_id.clone(),
                member: j.member_id.clone(),
                generation: f.number,
                address: m.address.clone(),
                found: j.address.clone(),
            });
        }
        if let Some(number) = self.retry_of_running(j) {
            return Ok(number); // its join's answer was lost: it never ran in the generation
        }
        if let Some(f) = self.forming().filter(|f| f.world_size() >= self.max) {
            return Err(GenerationError::Full {
                run: self.run_id.clone(),
                member: j.member_id.clone(),
                generation: f.number,
                max: self.max,
            });
        }
        self.record_rejoin(j);
        self.end_or_signal_running(j, now_ms);
        let f = self.open_forming(now);
        f.members.push(Member {
            member_id: j.member_id.clone(),
            address: j.address.clone(),
            host: j.host.clone(),
            rank: None,
            left: false,
        });
        f.first_step = f.first_step.max(j.step);
        f.settle = j.settle;
        f.last_join = now;
        let number = f.number;
        self.touch(number);
        Ok(number)
    }

    /// The running generation's number if `j` is a retry of a join to it:
    /// the member is in it from the same address, says it was last in an
    /// older generation, and has sent no heartbeat since it closed (a member
    /// that did has run in it, and joining again re-forms the world).
    fn retry_of_running(&self, j: &MemberJoin) -> Option<i64> {
        let r = self.running()?;
        let m = r.member(&j.member_id)?;
        // Beats for an older generation come from a member still waiting for
        // its answer: it has not run in this one.
        let ran = self.beats.get(&j.member_id).is_some_and(|b| b.generation >= r.number);
        let retry = m.address == j.address && j.after < r.number && !ran;
        retry.then_some(r.number)
    }

    /// The checks of a join against the run: its sizes, its
    /// `after_generation`, and whether the world re-formed without it.
    fn check_join(&self, j: &MemberJoin) -> Result<(), GenerationError> {
        if (j.min, j.max) != (self.min, self.max) {
            return Err(GenerationError::SizesDisagree {
                run: self.run_id.clone(),
                member: j.member_id.clone(),
                min: self.min,
                max: self.max,
                found_min: j.min,
                found_max: j.max,
            });
        }
        if j.after > self.newest() {
            return Err(GenerationError::FutureGeneration {
                run: self.run_id.clone(),
                member: j.member_id.clone(),
                after: j.after,
                newest: self.newest(),
            });
        }
        let lost = self.lost_in_a_row(&j.member_id);
        if lost.len() >= MAX_LOSSES_IN_A_ROW {
            return Err(GenerationError::Excluded {
                run: self.run_id.clone(),
                member: j.member_id.clone(),
                generations: lost,
            });
        }
        if self.forming().is_some_and(|f| f.member(&j.member_id).is_some()) || j.after == 0 {
            return Ok(());
        }
        let without = self.generations.iter().find(|g| {
            g.number > j.after && g.state != GenerationState::Forming && g.member(&j.member_id).is_none()
        });
        match without {
            Some(g) => Err(GenerationError::LeftOut {
                run: self.run_id.clone(),
                member: j.member_id.clone(),
                formed: g.number,
                last: j.after,
            }),
            None => Ok(()),
        }
    }

    /// The ended generations, oldest first, that `member_id` was lost in
    /// since the last one it was in and not lost (generations without it do
    /// not break the row: it was being replaced). Read from the generations
    /// themselves, so it survives a coordinator restart.
    pub fn lost_in_a_row(&self, member_id: &str) -> Vec<i64> {
        let mut row: Vec<i64> = self
            .generations
            .iter()
            .rev()
            .filter(|g| g.state == GenerationState::Ended && g.member(member_id).is_some())
            .take_while(|g| g.lost.contains(member_id))
            .map(|g| g.number)
            .collect();
        row.reverse();
        row
    }

    /// What a member re-joining after its generation says of it: the step it
    /// reached, and the members its cause names lost.
    fn record_rejoin(&mut self, j: &MemberJoin) {
        let Some(g) = self.generation_mut(j.after) else { return };
        if g.state == GenerationState::Forming || g.member(&j.member_id).is_none() {
            return;
        }
        g.last_step = g.last_step.max(j.step);
        // A member that re-joins is not lost, whoever named it: a survivor
        // that dropped its connections to re-form looks lost to the others.
        g.lost.remove(&j.member_id);
        let number = g.number;
        let named = self.named_lost(&j.cause, &j.member_id);
        if let Some(g) = self.generation_mut(number) {
            g.lost.extend(named);
        }
        self.touch(number);
    }

    /// The members `cause` names lost, but for `joiner` and those already
    /// back in the forming generation.
    fn named_lost(&self, cause: &GenerationEnding, joiner: &str) -> Vec<String> {
        if !cause.names_losses() {
            return Vec::new();
        }
        let back = |m: &str| self.forming().is_some_and(|f| f.member(m).is_some());
        cause.members.iter().filter(|m| *m != joiner && !back(m)).cloned().collect()
    }

    /// The running generation, on a join to the next: ended if the joiner is
    /// one of its members (it stopped training in it), else told that a
    /// member was added.
    fn end_or_signal_running(&mut self, j: &MemberJoin, now_ms: i64) {
        let Some(r) = self.generations.iter_mut().rev().find(|g| g.state == GenerationState::Running) else {
            return;
        };
        let number = r.number;
        if r.member(&j.member_id).is_none() {
            GenerationEnding::merge(&mut r.reform, v1::EndKind::MemberAdded, &j.member_id);
            self.touch(number);
            return;
        }
        r.last_step = r.last_step.max(j.step);
        let end = if j.cause.kind != v1::EndKind::Unspecified {
            j.cause.clone()
        } else {
            r.reform.clone().unwrap_or_else(|| GenerationEnding {
                kind: v1::EndKind::Unspecified,
                members: Vec::new(),
                detail: format!("member {:?} re-joined (after generation {})", j.member_id, j.after),
            })
        };
        r.lost.remove(&j.member_id);
        let named = self.named_lost(&end, &j.member_id);
        let r = self.generation_mut(number).expect("found above");
        r.lost.extend(named);
        r.finish(end, now_ms);
        self.touch(number);
    }

    /// Withdraws `member_id` (from `address`) from forming generation
    /// `number`, after its join timed out; returns whether it was there.
    pub fn withdraw(&mut self, number: i64, member_id: &str, address: &str) -> bool {
        let Some(f) = self.forming_mut().filter(|f| f.number == number) else { return false };
        let Some(i) = f.members.iter().position(|m| m.member_id == member_id && m.address == address) else {
            return false;
        };
        f.members.remove(i);
        self.touch(number);
        true
    }

    /// Why forming generation `number` has not closed, in words: who joined,
    /// who of the generation before did not come, the minimum.
    pub fn shortfall(&self, number: i64) -> String {
        let joined = self.generation(number).map(Generation::ids).unwrap_or_default();
        let prev = self.generation(number - 1);
        let lost: Vec<String> =
            prev.map(|p| p.ids().into_iter().filter(|m| !joined.contains(m)).collect()).unwrap_or_default();
        let waiting = match prev {
            Some(p) if p.state != GenerationState::Ended => {
                format!("; generation {} still runs (none of its members re-joined)", p.number)
            }
            _ => String::new(),
        };
        format!(
            "members {joined:?} joined (min_size {}, max_size {}), lost: {lost:?}{waiting}",
            self.min, self.max
        )
    }
}

/// Closing.
impl Generations {
    /// Closes the forming generation if the closing rule holds at `now`:
    /// the generation before it (if any) has ended, and it has `max`
    /// members, or at least `min` and either every member of the generation
    /// before not named lost has joined or its settle time passed since its
    /// last join. Generation 1 has no generation before: it waits for `max`
    /// or the settle time. Returns whether it closed.
    pub fn try_close(&mut self, now: Instant, now_ms: i64) -> bool {
        let Some(f) = self.forming() else { return false };
        let prev = self.generation(f.number - 1);
        if prev.is_some_and(|p| p.state != GenerationState::Ended) {
            return false;
        }
        let n = f.world_size();
        let all_back = prev.is_some_and(|p| {
            p.members.iter().all(|m| p.lost.contains(&m.member_id) || f.member(&m.member_id).is_some())
        });
        let settled = now.saturating_duration_since(f.last_join) >= f.settle;
        if !(n >= self.max || (n >= self.min && (all_back || settled))) {
            return false;
        }
        let old_rank = |id: &str| prev.and_then(|p| p.member(id)).and_then(|m| m.rank);
        let mut order: Vec<(Option<usize>, Member)> =
            f.members.iter().map(|m| (old_rank(&m.member_id), m.clone())).collect();
        // Members of the last world keep their order; newcomers follow by
        // member id in natural order, so a launcher's slots and a Job's
        // indexes get ranks in their own order whichever connected first.
        order.sort_by(|(a, ma), (b, mb)| {
            (a.is_none(), *a)
                .cmp(&(b.is_none(), *b))
                .then_with(|| natural_order(&ma.member_id, &mb.member_id))
        });
        let f = self.forming_mut().expect("checked above");
        f.members = order.into_iter().map(|(_, m)| m).collect();
        for (rank, m) in f.members.iter_mut().enumerate() {
            m.rank = Some(rank);
        }
        f.state = GenerationState::Running;
        f.started_ms = now_ms.max(1);
        let (number, ids) = (f.number, f.ids());
        for id in ids {
            self.beats.remove(&id); // beats count again from the first in this generation
        }
        self.touch(number);
        true
    }

    /// When the forming generation may close by its settle time, if it
    /// waits for nothing else (the generation before has ended and it has
    /// `min` members): the timer a waiting join sleeps until.
    pub fn settle_deadline(&self) -> Option<Instant> {
        let f = self.forming()?;
        let prev_ended = self.generation(f.number - 1).is_none_or(|p| p.state == GenerationState::Ended);
        (prev_ended && f.world_size() >= self.min).then(|| f.last_join + f.settle)
    }

    /// The world of generation `number` for its member `member_id`, once it
    /// has closed: the member's rank and the peer table by rank.
    pub fn world_of(&self, number: i64, member_id: &str) -> Option<(usize, Vec<v1::Peer>)> {
        let g = self.generation(number).filter(|g| g.has_run())?;
        let rank = g.member(member_id)?.rank?;
        let mut per_host: HashMap<&str, i32> = HashMap::new();
        let peers = g
            .members
            .iter()
            .enumerate()
            .map(|(rank, m)| {
                let local = per_host.entry(m.host.as_str()).or_insert(0);
                let peer = v1::Peer {
                    rank: rank as i32,
                    address: m.address.clone(),
                    host: m.host.clone(),
                    local_rank: *local,
                    member_id: m.member_id.clone(),
                };
                *local += 1;
                peer
            })
            .collect();
        Some((rank, peers))
    }
}

/// Heartbeats, the watchdog, leaves.
impl Generations {
    /// Records a heartbeat of `member_id`, which runs in `generation`, and
    /// answers whether a newer generation forms or runs, and why.
    pub fn heartbeat(
        &mut self,
        member_id: &str,
        generation: i64,
        now: Instant,
    ) -> Result<Heard, GenerationError> {
        if !self.generations.iter().any(|g| g.member(member_id).is_some()) {
            return Err(GenerationError::NotAMember {
                run: self.run_id.clone(),
                member: member_id.to_string(),
            });
        }
        self.beats.insert(member_id.to_string(), LastBeat { at: now, generation });
        let reform =
            self.generations.iter().any(|g| g.number > generation && g.state != GenerationState::Ended);
        let cause = self.generation(generation).and_then(|g| g.end.clone().or_else(|| g.reform.clone()));
        Ok(Heard { newest: self.newest(), reform, cause: if reform { cause } else { None } })
    }

    /// Names lost the members of the running generation that sent heartbeats
    /// and then none for `timeout` (once each), and opens the next generation
    /// so the others re-form; returns them.
    pub fn lose_silent(&mut self, timeout: Duration, now: Instant) -> Vec<String> {
        let Some(r) = self.generations.iter().rev().find(|g| g.state == GenerationState::Running) else {
            return Vec::new();
        };
        let silent: Vec<String> = r
            .members
            .iter()
            .filter(|m| !m.left && !r.lost.contains(&m.member_id))
            .filter(|m| {
                self.beats.get(&m.member_id).is_some_and(|b| {
                    b.generation >= r.number && now.saturating_duration_since(b.at) >= timeout
                })
            })
            .map(|m| m.member_id.clone())
            .collect();
        if silent.is_empty() {
            return silent;
        }
        let number = r.number;
        let r = self.generation_mut(number).expect("found above");
        for m in &silent {
            r.lost.insert(m.clone());
            GenerationEnding::merge(&mut r.reform, v1::EndKind::Heartbeat, m);
        }
        self.touch(number);
        self.open_forming(now);
        silent
    }

    /// A member leaves: without an error, it has left its running generation
    /// (which ends finished once every member not named lost has left, and
    /// the run with it); with one, the run fails (every generation not
    /// ended ends failed). A member waiting in a forming generation is
    /// withdrawn from it.
    pub fn leave(
        &mut self,
        member_id: &str,
        step: i64,
        error: &str,
        now_ms: i64,
    ) -> Result<(), GenerationError> {
        if !self.generations.iter().any(|g| g.member(member_id).is_some()) {
            return Err(GenerationError::NotAMember {
                run: self.run_id.clone(),
                member: member_id.to_string(),
            });
        }
        if !error.is_empty() {
            let end = GenerationEnding {
                kind: v1::EndKind::Failed,
                members: vec![member_id.to_string()],
                detail: error.to_string(),
            };
            self.end_all(&end, step, now_ms);
            return Ok(());
        }
        if let Some(number) = self.forming().filter(|f| f.member(member_id).is_some()).map(|f| f.number) {
            let address =
                self.generation(number).and_then(|f| f.member(member_id)).map(|m| m.address.clone());
            self.withdraw(number, member_id, &address.unwrap_or_default());
        }
        let Some(number) = self.running().filter(|r| r.member(member_id).is_some()).map(|r| r.number) else {
            return Ok(());
        };
        let r = self.generation_mut(number).expect("found above");
        r.last_step = r.last_step.max(step);
        if let Some(m) = r.members.iter_mut().find(|m| m.member_id == member_id) {
            m.left = true;
        }
        let all_left = r.members.iter().all(|m| m.left || r.lost.contains(&m.member_id));
        self.touch(number);
        if all_left {
            // The run is over: a generation forming after it never runs.
            self.end_all(&GenerationEnding::of(v1::EndKind::Finished, &[]), step, now_ms);
        }
        Ok(())
    }
}

impl Generations {
    /// Ends every generation not ended yet with `end` (the run is over),
    /// those that ran at `step` at the latest.
    fn end_all(&mut self, end: &GenerationEnding, step: i64, now_ms: i64) {
        let open: Vec<i64> =
            self.generations.iter().filter(|g| g.state != GenerationState::Ended).map(|g| g.number).collect();
        for number in open {
            let g = self.generation_mut(number).expect("listed above");
            if g.has_run() {
                g.last_step = g.last_step.max(step);
            }
            g.finish(end.clone(), now_ms);
            self.touch(number);
        }
    }
}

/// Member ids compared as people read them: runs of digits by their value
/// (`slot-2` before `slot-10`, `pod-007` beside `pod-7` by value), the rest
/// byte by byte.
pub(super) fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn pieces(s: &str) -> impl Iterator<Item = (bool, &str)> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = rest.chars().next()?;
            let digits = first.is_ascii_digit();
            let end = rest.find(|c: char| c.is_ascii_digit() != digits).unwrap_or(rest.len());
            let (piece, tail) = rest.split_at(end);
            rest = tail;
            Some((digits, piece))
        })
    }
    let number = |p: &str| {
        let p = p.trim_start_matches('0');
        (p.len(), p.to_string())
    };
    let key = |s: &str| -> Vec<(bool, (usize, String))> {
        pieces(s).map(|(d, p)| if d { (false, number(p)) } else { (true, (0, p.to_string())) }).collect()
    };
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

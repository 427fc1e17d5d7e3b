//! The cause: which ranks and workers started a loader's epoch with a stream
//! in the same state, and whether they drew from it.
//!
//! Two members (a rank's worker, or its main process) whose stream had one
//! fingerprint at the start of the same loader's epoch draw the same numbers
//! from it. When at least two of them draw from it while fetching, their
//! augmentation is the same: the alarm. A stream shared but never drawn from
//! by the loader changes no batch: a warning (it would, the day the loader
//! draws from it).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::note::{DrawPlace, Drawer, LoaderEpoch, Note, RandomStream};

/// Members whose stream started one loader's epoch in one state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedStream {
    /// The loader's epoch.
    pub at: LoaderEpoch,
    /// The stream.
    pub stream: RandomStream,
    /// Each group of members that shared one state (two or more each).
    pub groups: Vec<Vec<Drawer>>,
    /// Whether two or more members of a group drew from it (the alarm), or none did.
    pub drawn: bool,
}

impl SharedStream {
    /// Whether a worker's stream (not a main process's) is shared: PyTorch
    /// seeds workers from a base seed the main process draws.
    pub fn in_workers(&self) -> bool {
        self.groups.iter().flatten().any(|m| matches!(m.place, DrawPlace::Worker(_)))
    }

    /// Whether the members of some group are on different ranks (the story),
    /// rather than workers of one rank alike.
    pub fn across_ranks(&self) -> bool {
        self.groups.iter().any(|g| g.iter().any(|m| m.rank != g[0].rank))
    }
}

impl fmt::Display for SharedStream {
    /// `torch's default generator (loader 0, epoch 0): worker 0 of ranks 0, 1;
    /// worker 1 of ranks 0, 1 each started in one state`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): ", self.stream, self.at)?;
        for (i, group) in self.groups.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            let place = group[0].place;
            if group.iter().all(|m| m.place == place) {
                let ranks: Vec<String> = group.iter().map(|m| m.rank.to_string()).collect();
                write!(f, "{place} of ranks {}", ranks.join(", "))?;
            } else {
                let members: Vec<String> =
                    group.iter().map(|m| format!("rank {} {}", m.rank, m.place)).collect();
                f.write_str(&members.join(", "))?;
            }
        }
        f.write_str(if self.groups.len() == 1 {
            " started in one state"
        } else {
            " each started in one state"
        })
    }
}

/// Every fingerprint and draw noted so far, and the alarms raised.
#[derive(Debug, Default)]
pub struct StreamCensus {
    /// (epoch, stream) -> fingerprint -> the members that started there.
    states: BTreeMap<(LoaderEpoch, RandomStream), BTreeMap<String, BTreeSet<Drawer>>>,
    drawn: BTreeSet<(LoaderEpoch, RandomStream, Drawer)>,
    /// One alarm a (loader, stream): the later epochs of a run repeat it.
    raised: BTreeSet<(u32, RandomStream)>,
}

impl StreamCensus {
    /// An empty census.
    pub fn new() -> Self {
        StreamCensus::default()
    }

    /// Adds a note; returns the alarms it completes (each (loader, stream) once).
    pub fn add(&mut self, note: &Note) -> Vec<SharedStream> {
        let touched: Vec<(LoaderEpoch, RandomStream)> = match note {
            Note::Streams { member, at, fingerprints } => fingerprints
                .iter()
                .map(|(stream, fp)| {
                    self.states
                        .entry((*at, *stream))
                        .or_default()
                        .entry(fp.clone())
                        .or_default()
                        .insert(*member);
                    (*at, *stream)
                })
                .collect(),
            Note::Drawn { member, at, streams } => streams
                .iter()
                .map(|stream| {
                    self.drawn.insert((*at, *stream, *member));
                    (*at, *stream)
                })
                .collect(),
            Note::Mask { .. } => Vec::new(),
        };
        let mut alarms = Vec::new();
        for (at, stream) in touched {
            if self.raised.contains(&(at.loader, stream)) {
                continue;
            }
            if let Some(shared) = self.shared(at, stream, true) {
                self.raised.insert((at.loader, stream));
                alarms.push(shared);
            }
        }
        alarms
    }

    /// Every alarm raised so far, in full: each (loader, stream)'s first
    /// epoch with two members drawing from one state, with every group that
    /// has by now (an alarm is raised at the first two; the rest of a run's
    /// notes may add to it).
    pub fn alarms(&self) -> Vec<SharedStream> {
        let mut out: Vec<SharedStream> = Vec::new();
        for &(at, stream) in self.states.keys() {
            if !self.raised.contains(&(at.loader, stream))
                || out.iter().any(|s| s.at.loader == at.loader && s.stream == stream)
            {
                continue;
            }
            out.extend(self.shared(at, stream, true));
        }
        out
    }

    /// The streams shared but never drawn from by two members of a group,
    /// for each (loader, stream) that raised no alarm: its first epoch.
    pub fn warnings(&self) -> Vec<SharedStream> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for &(at, stream) in self.states.keys() {
            if self.raised.contains(&(at.loader, stream)) || seen.contains(&(at.loader, stream)) {
                continue;
            }
            if let Some(shared) = self.shared(at, stream, false) {
                seen.insert((at.loader, stream));
                out.push(shared);
            }
        }
        out
    }

    /// The groups of two or more members sharing a state of `stream` at
    /// `at`: only the drawing members of groups where two or more drew
    /// (`drawn`), or every group where fewer than two drew.
    fn shared(&self, at: LoaderEpoch, stream: RandomStream, drawn: bool) -> Option<SharedStream> {
        let states = self.states.get(&(at, stream))?;
        let groups: Vec<Vec<Drawer>> = states
            .values()
            .filter(|members| members.len() >= 2)
            .filter_map(|members| {
                let drew: Vec<Drawer> =
                    members.iter().copied().filter(|m| self.drawn.contains(&(at, stream, *m))).collect();
                match (drawn, drew.len() >= 2) {
                    (true, true) => Some(drew),
                    (false, false) => Some(members.iter().copied().collect()),
                    _ => None,
                }
            })
            .collect::<Vec<_>>();
        let mut groups = groups;
        groups.sort();
        (!groups.is_empty()).then_some(SharedStream { at, stream, groups, drawn })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: LoaderEpoch = LoaderEpoch { loader: 0, epoch: 0 };

    fn streams(rank: usize, worker: u32, fp: &str) -> Note {
        Note::Streams {
            member: Drawer { rank, place: DrawPlace::Worker(worker) },
            at: AT,
            fingerprints: [
                (RandomStream::Torch, fp.to_string()),
                (RandomStream::Random, format!("{rank}-{worker}")),
            ]
            .into(),
        }
    }

    fn drawn(rank: usize, worker: u32, stream: RandomStream) -> Note {
        Note::Drawn {
            member: Drawer { rank, place: DrawPlace::Worker(worker) },
            at: AT,
            streams: vec![stream],
        }
    }

    #[test]
    fn worker_k_of_every_rank_in_one_state_drawing_from_it_is_the_alarm_once() {
        let mut census = StreamCensus::new();
        let mut alarms = Vec::new();
        for rank in 0..2 {
            for worker in 0..2 {
                alarms.extend(census.add(&streams(rank, worker, &format!("w{worker}"))));
                alarms.extend(census.add(&drawn(rank, worker, RandomStream::Torch)));
            }
        }
        assert_eq!(alarms.len(), 1, "{alarms:?}");
        // The alarm came when worker 0 of rank 1 drew; worker 1 joins no new alarm.
        assert_eq!(
            alarms[0].groups,
            vec![vec![
                Drawer { rank: 0, place: DrawPlace::Worker(0) },
                Drawer { rank: 1, place: DrawPlace::Worker(0) }
            ]]
        );
        assert!(alarms[0].drawn && alarms[0].in_workers() && alarms[0].across_ranks());
        assert_eq!(
            alarms[0].to_string(),
            "torch's default generator (loader 0, epoch 0): worker 0 of ranks 0, 1 started in one state"
        );
        // Python's random differs everywhere: nothing to warn of either.
        assert!(census.warnings().is_empty(), "{:?}", census.warnings());
    }

    #[test]
    fn a_shared_stream_no_one_draws_from_is_a_warning_and_distinct_streams_are_nothing() {
        let mut census = StreamCensus::new();
        for rank in 0..3 {
            assert!(census.add(&streams(rank, 0, "same")).is_empty());
        }
        // One member drawing from a shared state duplicates nothing.
        assert!(census.add(&drawn(2, 0, RandomStream::Torch)).is_empty());
        let warnings = census.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(!warnings[0].drawn);
        assert_eq!(warnings[0].groups[0].len(), 3);

        let mut census = StreamCensus::new();
        for rank in 0..3 {
            census.add(&streams(rank, 0, &format!("own-{rank}")));
            assert!(census.add(&drawn(rank, 0, RandomStream::Torch)).is_empty());
        }
        assert!(census.warnings().is_empty());
    }
}

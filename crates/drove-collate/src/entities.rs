//! Entity-level precision, recall and F1 as conlleval and seqeval's default mode
//! compute them: chunks are read leniently (an `I-X` after `O` or after another
//! type starts a chunk), and a predicted chunk counts only if its type, start and
//! end all match a gold chunk.
//!
//! Ranks reduce [`EntityCounts`] (true positives, false positives, false
//! negatives) by summing them, never by averaging F1 scores.

use std::collections::HashSet;

/// A chunk: entity type and the half-open token range `[start, end)`.
pub type Chunk = (String, usize, usize);

fn split(tag: &str) -> (char, &str) {
    if tag == "O" || tag.is_empty() {
        return ('O', "");
    }
    let prefix = tag.chars().next().unwrap_or('O');
    match tag.split_once('-') {
        Some((_, kind)) => (prefix, kind),
        None => (prefix, ""),
    }
}

fn end_of_chunk(prev: char, tag: char, prev_type: &str, kind: &str) -> bool {
    matches!(prev, 'E' | 'S')
        || (prev == 'B' && matches!(tag, 'B' | 'S' | 'O'))
        || (prev == 'I' && matches!(tag, 'B' | 'S' | 'O'))
        || (prev != 'O' && prev != '.' && prev_type != kind)
}

fn start_of_chunk(prev: char, tag: char, prev_type: &str, kind: &str) -> bool {
    matches!(tag, 'B' | 'S')
        || (matches!(prev, 'E' | 'S' | 'O') && matches!(tag, 'E' | 'I'))
        || (tag != 'O' && tag != '.' && prev_type != kind)
}

/// The chunks of one tag sequence, conlleval-style.
pub fn chunks<S: AsRef<str>>(tags: &[S]) -> Vec<Chunk> {
    let mut out = Vec::new();
    let (mut prev, mut prev_type) = ('O', String::new());
    let mut start = 0;
    for (i, tag) in tags.iter().map(AsRef::as_ref).chain(std::iter::once("O")).enumerate() {
        let (t, kind) = split(tag);
        if end_of_chunk(prev, t, &prev_type, kind) {
            out.push((prev_type.clone(), start, i));
        }
        if start_of_chunk(prev, t, &prev_type, kind) {
            start = i;
        }
        prev = t;
        prev_type = kind.to_string();
    }
    out
}

/// True positives, false positives and false negatives over entities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EntityCounts {
    /// Predicted chunks that match a gold chunk exactly.
    pub tp: u64,
    /// Predicted chunks that match none.
    pub fp: u64,
    /// Gold chunks that no prediction matches.
    pub fn_: u64,
}

impl EntityCounts {
    /// Counts one sentence.
    pub fn sentence<S: AsRef<str>, T: AsRef<str>>(gold: &[S], predicted: &[T]) -> Self {
        let g: HashSet<Chunk> = chunks(gold).into_iter().collect();
        let p: HashSet<Chunk> = chunks(predicted).into_iter().collect();
        let tp = g.intersection(&p).count() as u64;
        EntityCounts { tp, fp: p.len() as u64 - tp, fn_: g.len() as u64 - tp }
    }

    /// Adds another count (e.g. another sentence's, or another rank's).
    pub fn add(&mut self, other: EntityCounts) {
        self.tp += other.tp;
        self.fp += other.fp;
        self.fn_ += other.fn_;
    }

    /// `tp / (tp + fp)` (0 when nothing was predicted).
    pub fn precision(&self) -> f64 {
        ratio(self.tp, self.tp + self.fp)
    }

    /// `tp / (tp + fn)` (0 when there is no gold entity).
    pub fn recall(&self) -> f64 {
        ratio(self.tp, self.tp + self.fn_)
    }

    /// Harmonic mean of precision and recall.
    pub fn f1(&self) -> f64 {
        let (p, r) = (self.precision(), self.recall());
        if p + r == 0.0 { 0.0 } else { 2.0 * p * r / (p + r) }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_read_like_conlleval() {
        let c = |tags: &[&str]| chunks(tags);
        assert_eq!(c(&["B-PER", "I-PER", "O", "B-LOC"]), vec![("PER".into(), 0, 2), ("LOC".into(), 3, 4)]);
        // An I- after O, or after another type, starts a chunk (lenient).
        assert_eq!(c(&["O", "I-ORG", "I-ORG", "I-LOC"]), vec![("ORG".into(), 1, 3), ("LOC".into(), 3, 4)]);
        // B after B splits.
        assert_eq!(c(&["B-MISC", "B-MISC"]), vec![("MISC".into(), 0, 1), ("MISC".into(), 1, 2)]);
        assert!(c(&["O", "O"]).is_empty());
    }

    #[test]
    fn counts_and_scores_match_seqeval() {
        // seqeval: y_true = [['O','O','O','B-MISC','I-MISC','I-MISC','O'], ['B-PER','I-PER','O']]
        //          y_pred = [['O','O','B-MISC','I-MISC','I-MISC','I-MISC','O'], ['B-PER','I-PER','O']]
        // f1_score = 0.5, precision 0.5, recall 0.5
        let mut total = EntityCounts::default();
        total.add(EntityCounts::sentence(
            &["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"],
            &["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"],
        ));
        total.add(EntityCounts::sentence(&["B-PER", "I-PER", "O"], &["B-PER", "I-PER", "O"]));
        assert_eq!(total, EntityCounts { tp: 1, fp: 1, fn_: 1 });
        assert_eq!((total.precision(), total.recall(), total.f1()), (0.5, 0.5, 0.5));
        // A wrong type is both a false positive and a false negative.
        let t = EntityCounts::sentence(&["B-LOC"], &["B-ORG"]);
        assert_eq!(t, EntityCounts { tp: 0, fp: 1, fn_: 1 });
        assert_eq!(EntityCounts::default().f1(), 0.0);
    }

    /// Values printed by seqeval 1.2 (`precision_score`, `recall_score`,
    /// `f1_score`, default mode) for these sentences: 0.5, 0.5714, 0.5333.
    #[test]
    fn tricky_sequences_agree_with_seqeval() {
        let gold: [&[&str]; 5] = [
            &["B-PER", "I-PER", "O", "B-LOC", "I-LOC"],
            &["O", "B-ORG", "I-ORG", "I-ORG", "O"],
            &["I-MISC", "I-MISC", "O", "B-PER"],
            &["B-LOC", "B-LOC", "I-LOC", "O"],
            &["O", "O", "O"],
        ];
        let pred: [&[&str]; 5] = [
            &["B-PER", "I-PER", "O", "B-LOC", "O"],
            &["O", "I-ORG", "I-ORG", "I-ORG", "O"],
            &["B-MISC", "I-MISC", "O", "I-PER"],
            &["B-LOC", "I-LOC", "I-LOC", "O"],
            &["O", "B-PER", "I-LOC"],
        ];
        let mut total = EntityCounts::default();
        for (g, p) in gold.iter().zip(&pred) {
            total.add(EntityCounts::sentence(g, p));
        }
        assert_eq!(total, EntityCounts { tp: 4, fp: 4, fn_: 3 });
        assert!((total.precision() - 0.5).abs() < 1e-12);
        assert!((total.recall() - 0.5714285714285714).abs() < 1e-12);
        assert!((total.f1() - 0.5333333333333333).abs() < 1e-12);
    }
}

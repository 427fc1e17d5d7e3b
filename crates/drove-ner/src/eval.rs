//! Evaluation: each rank predicts a strided slice of a set, the entity counts
//! are summed across ranks, and rank 0 writes the predictions of the whole set.

use burn::tensor::backend::Backend;
use drove_bert::BertForTokenClassification;
use drove_collate::entities::EntityCounts;
use drove_collate::{Collator, Example, LabelSet, Padding};
use drove_collective::{Buffer, Collective, Element, ReduceOptions};

use crate::NerError;
use crate::data::{EvalSet, batch_tensors};

/// One evaluation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EvalReport {
    /// Which set.
    pub set: String,
    /// After which epoch (1-based).
    pub epoch: usize,
    /// Step.
    pub step: u64,
    /// Entity counts, summed over ranks.
    pub tp: u64,
    /// False positives.
    pub fp: u64,
    /// False negatives.
    pub fn_: u64,
    /// Precision.
    pub precision: f64,
    /// Recall.
    pub recall: f64,
    /// F1.
    pub f1: f64,
    /// Sentences evaluated.
    pub sentences: usize,
}

/// Evaluates this rank's slice (sentences `rank`, `rank + W`, ...) of `set`,
/// sums the entity counts across ranks and, on rank 0, returns the CoNLL
/// predictions file of the whole set.
pub(crate) fn evaluate<B: Backend>(
    model: &BertForTokenClassification<B>,
    set: &EvalSet,
    labels: &LabelSet,
    comm: &dyn Collective,
    epoch: usize,
    step: u64,
    device: &B::Device,
) -> Result<(EvalReport, Option<Vec<u8>>), NerError> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let (counts, encoded) = predict_slice(model, set, labels, rank, world, device)?;
    let mut sums = [counts.tp as i64, counts.fp as i64, counts.fn_ as i64];
    comm.all_reduce("eval.counts", &[3], i64::tensor_mut(&mut sums), ReduceOptions::sum())?;
    let total = EntityCounts { tp: sums[0] as u64, fp: sums[1] as u64, fn_: sums[2] as u64 };
    let gathered = comm.all_gather("eval.predictions", &[encoded.len()], i32::tensor_ref(&encoded))?;
    let text = if rank == 0 {
        let Buffer::I32(all) = gathered.data else { unreachable!("gathered i32") };
        Some(predictions_file(&all, set, labels))
    } else {
        None
    };
    Ok((
        EvalReport {
            set: set.name.clone(),
            epoch,
            step,
            tp: total.tp,
            fp: total.fp,
            fn_: total.fn_,
            precision: total.precision(),
            recall: total.recall(),
            f1: total.f1(),
            sentences: set.examples.len(),
        },
        text,
    ))
}

/// Predicts this rank's slice of `set`: its entity counts, and its predicted
/// labels encoded as `[sentence, words, label ids...]` per sentence, for the
/// gather.
fn predict_slice<B: Backend>(
    model: &BertForTokenClassification<B>,
    set: &EvalSet,
    labels: &LabelSet,
    rank: usize,
    world: usize,
    device: &B::Device,
) -> Result<(EntityCounts, Vec<i32>), NerError> {
    let mut mine: Vec<usize> = (rank..set.examples.len()).step_by(world).collect();
    mine.sort_by_key(|&i| set.examples[i].len());
    let collator = Collator::new(0, Padding::Longest { multiple_of: 1 }, None);
    let mut counts = EntityCounts::default();
    let mut encoded: Vec<i32> = Vec::new();
    for chunk in mine.chunks(64) {
        let examples: Vec<&Example> = chunk.iter().map(|&i| &set.examples[i]).collect();
        let batch = collator.collate(&examples, chunk, drove_collate::MaskSource::None)?;
        let (ids, types, mask) = batch_tensors::<B>(&batch, device);
        let predicted = model.forward(ids, types, mask).argmax(2);
        let predicted: Vec<i64> = drove_kernels::transfer::read(predicted)
            .convert::<i64>()
            .to_vec::<i64>()
            .map_err(|e| NerError::Options(format!("reading predictions: {e:?}")))?;
        for (r, &i) in chunk.iter().enumerate() {
            let sentence = &set.corpus.sentences[i];
            let example = &set.examples[i];
            let mut words = vec![0usize; sentence.words.len()]; // "O" where truncated away
            for (t, (&w, &y)) in example.word_ids.iter().zip(&example.labels).enumerate() {
                if let (Some(w), true) = (w, y >= 0) {
                    words[w as usize] = predicted[r * batch.seq_len + t].max(0) as usize;
                }
            }
            let tags: Vec<&str> = words.iter().map(|&k| labels.tags()[k].as_str()).collect();
            counts.add(EntityCounts::sentence(&sentence.tags, &tags));
            encoded.push(i as i32);
            encoded.push(words.len() as i32);
            encoded.extend(words.iter().map(|&k| k as i32));
        }
    }
    Ok((counts, encoded))
}

/// The CoNLL predictions file of `set` (`word gold predicted` per line) from
/// every rank's gathered [`predict_slice`] encoding.
fn predictions_file(all: &[i32], set: &EvalSet, labels: &LabelSet) -> Vec<u8> {
    let mut per_sentence: Vec<Vec<usize>> = vec![Vec::new(); set.corpus.sentences.len()];
    let mut at = 0;
    while at + 1 < all.len() {
        let (i, n) = (all[at] as usize, all[at + 1] as usize);
        per_sentence[i] = all[at + 2..at + 2 + n].iter().map(|&k| k as usize).collect();
        at += 2 + n;
    }
    let mut out = String::new();
    for (s, predicted) in set.corpus.sentences.iter().zip(&per_sentence) {
        for (k, (word, gold)) in s.words.iter().zip(&s.tags).enumerate() {
            let p = predicted.get(k).map_or("O", |&id| labels.tags()[id].as_str());
            out.push_str(&format!("{word} {gold} {p}\n"));
        }
        out.push('\n');
    }
    out.into_bytes()
}

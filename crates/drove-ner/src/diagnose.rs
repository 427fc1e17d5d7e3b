//! The diversity diagnostic: every rank's masks and its local gradient of one
//! parameter, compared across ranks at a diagnosed step.

use drove_collate::Batch;
use drove_collective::{Buffer, Collective, Element};
use drove_diagnostic::{AgreementAccumulator, GradCosine, RowMasks};

use crate::{DiagnoseReport, NerError, NerOptions, Observer};

/// The index of the parameter the diagnostic compares, when it runs.
pub(crate) fn diagnosed_parameter(
    opts: &NerOptions,
    names: &[String],
    layers: usize,
    world: usize,
    observer: &mut dyn Observer,
) -> Result<Option<usize>, NerError> {
    if opts.diagnose_every == 0 {
        return Ok(None);
    }
    if world < 2 {
        observer.note("--diagnose-every compares ranks: with one rank there is nothing to compare; ignored");
        return Ok(None);
    }
    let name = resolve_parameter(&opts.diagnose_parameter, layers);
    names.iter().position(|n| *n == name).map(Some).ok_or_else(|| {
        NerError::Options(format!(
            "--diagnose-parameter {name:?} is not a parameter; some that are: {:?}",
            &names[names.len().saturating_sub(6)..]
        ))
    })
}

/// Resolves `bert.layers.last.…` to the last layer's index.
fn resolve_parameter(name: &str, layers: usize) -> String {
    name.replace("layers.last.", &format!("layers.{}.", layers.saturating_sub(1)))
}

/// All-gathers this step's masks and the local gradient of the diagnosed
/// parameter; every rank computes the same report.
pub(crate) fn diagnose(
    comm: &dyn Collective,
    batch: &Batch,
    grad: &[f32],
    step: u64,
    run: &mut AgreementAccumulator,
) -> Result<DiagnoseReport, NerError> {
    let codes = encode_masks(batch);
    let gathered = comm.all_gather("diagnose.masks", &[codes.len()], i32::tensor_ref(&codes))?;
    let Buffer::I32(all) = gathered.data else { unreachable!("gathered i32") };
    let masks: Vec<RowMasks> =
        split_gathered(&all, &gathered.first_dims).iter().map(|c| decode_masks(c)).collect();
    let mut this_step = AgreementAccumulator::new(masks.len(), run.probability());
    this_step.add_step(&masks);
    run.add_step(&masks);
    // The verdict over every diagnosed step so far: one step of a small batch
    // may compare too few positions to be sure.
    let so_far = run.report();
    let gathered = comm.all_gather("diagnose.gradient", &[grad.len()], f32::tensor_ref(grad))?;
    let Buffer::F32(all) = gathered.data else { unreachable!("gathered f32") };
    let grads = split_gathered(&all, &gathered.first_dims);
    let report = this_step.report();
    Ok(DiagnoseReport {
        step,
        masks: so_far,
        mask_agreement: report.mean_agreement,
        mask_expected: report.expected,
        mask_sigma: report.sigma,
        grad_cosine: GradCosine::of(&grads).mean,
    })
}

/// Encodes a batch's masks for the all-gather: rows, width, then one code per
/// position (0: not maskable, 1: maskable, 2: maskable and chosen).
fn encode_masks(batch: &Batch) -> Vec<i32> {
    let mut out = Vec::with_capacity(2 + batch.actions.len());
    out.push(batch.batch_size as i32);
    out.push(batch.seq_len as i32);
    out.extend(
        batch
            .maskable
            .iter()
            .zip(&batch.actions)
            .map(|(&m, a)| i32::from(m) * (1 + i32::from(a.is_chosen()))),
    );
    out
}

/// The masks of [`encode_masks`]'s codes.
fn decode_masks(codes: &[i32]) -> RowMasks {
    let width = codes[1].max(0) as usize;
    RowMasks {
        width,
        chosen: codes[2..].iter().map(|&c| c == 2).collect(),
        maskable: codes[2..].iter().map(|&c| c > 0).collect(),
    }
}

/// An all-gather's data cut into each rank's part.
fn split_gathered<T: Clone>(data: &[T], first_dims: &[usize]) -> Vec<Vec<T>> {
    let mut out = Vec::with_capacity(first_dims.len());
    let mut at = 0;
    for &n in first_dims {
        out.push(data[at..at + n].to_vec());
        at += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_layer_alias_resolves() {
        assert_eq!(resolve_parameter("bert.layers.last.query.weight", 6), "bert.layers.5.query.weight");
        assert_eq!(resolve_parameter("classifier.weight", 6), "classifier.weight");
    }

    #[test]
    fn masks_survive_the_encoding() {
        use drove_collate::MaskAction;
        let batch = Batch {
            batch_size: 1,
            seq_len: 4,
            maskable: vec![false, true, true, false],
            actions: vec![MaskAction::None, MaskAction::Mask, MaskAction::None, MaskAction::None],
            ..Batch::default()
        };
        let masks = decode_masks(&encode_masks(&batch));
        assert_eq!(masks, RowMasks::from(&batch));
    }
}

//! The metrics of a fine-tune: [`MetricsObserver`] records what the loop
//! reports as metric points of the run on a coordinator (feature `metrics`).

use std::time::Duration;

use drove_metrics::{Delivery, MetricsRecorder, Reading, RecorderError, metric_names};

use crate::{DiagnoseReport, EvalReport, NerOptions, Observer, ReformReport, StepReport};

/// How long an event of the run (the options, the diversity alarm) may wait
/// for the coordinator.
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

/// An [`Observer`] that records every rank's steps, evaluations and
/// diagnostics as metric points through a [`MetricsRecorder`], and rank 0's
/// diversity alarm as an event of the run.
///
/// It prints nothing: an event the coordinator did not take is kept for the
/// caller ([`MetricsObserver::take_errors`]), and a program that shows
/// progress composes this with an observer of its own.
#[derive(Debug)]
pub struct MetricsObserver {
    recorder: MetricsRecorder,
    rank: usize,
    errors: Vec<RecorderError>,
}

impl MetricsObserver {
    /// Records to `recorder` as rank `rank`.
    pub fn new(recorder: MetricsRecorder, rank: usize) -> Self {
        MetricsObserver { recorder, rank, errors: Vec::new() }
    }

    /// The recorder (to flush it before a deliberate exit, say).
    pub fn recorder(&self) -> &MetricsRecorder {
        &self.recorder
    }

    /// The events the coordinator did not take since the last call.
    pub fn take_errors(&mut self) -> Vec<RecorderError> {
        std::mem::take(&mut self.errors)
    }

    /// The run's settings as its `options` event (what `drove report` shows
    /// in its header): `opts` as resolved, with the world size and the
    /// restart, as one JSON object.
    pub fn record_options(
        &self,
        opts: &NerOptions,
        world_size: usize,
        restart: u32,
    ) -> Result<(), RecorderError> {
        let mut options = serde_json::to_value(opts).unwrap_or_default();
        if let Some(o) = options.as_object_mut() {
            // The name `--seeding` takes, not the enum's.
            o.insert("seeding".into(), opts.seeding.name().into());
            o.insert("world_size".into(), world_size.into());
            o.insert("restart".into(), restart.into());
        }
        self.recorder.event(0.0, metric_names::event::OPTIONS, &options.to_string(), EVENT_TIMEOUT)
    }

    /// Stops recording and says what became of the points
    /// ([`MetricsRecorder::close`]).
    pub fn close(self) -> Delivery {
        self.recorder.close()
    }

    /// A point, unless the value is NaN or infinite.
    fn record(&self, step: u64, name: &str, value: f64) {
        if value.is_finite() {
            self.recorder.record(Reading { step: step as f64, name, value });
        }
    }
}

impl Observer for MetricsObserver {
    fn step(&mut self, r: &StepReport) {
        self.record(r.step, metric_names::LOSS, r.loss);
        self.record(r.step, metric_names::LR, r.lr);
        self.record(r.step, metric_names::GRAD_NORM, r.grad_norm);
        self.record(r.step, metric_names::SENTENCES_PER_S, r.sentences_per_s);
        self.record(r.step, metric_names::TOKENS_PER_S, r.tokens_per_s);
        self.record(r.step, metric_names::EPOCH, r.epoch as f64);
        self.record(r.step, metric_names::WORLD_SIZE, r.world_size as f64);
        self.record(r.step, metric_names::GENERATION, r.generation as f64);
    }

    /// Later points go under the member's new rank; the event once per
    /// world, from its rank 0.
    fn reformed(&mut self, r: &ReformReport) {
        self.rank = r.rank;
        self.recorder.set_rank(r.rank);
        if r.rank == 0 {
            let message = format!(
                "generation {}: {} rank(s) from step {} (state from rank {}, sent to {:?}) after {:.1} s; the last world ended: {}",
                r.generation, r.world_size, r.step, r.source, r.behind, r.seconds, r.cause
            );
            if let Err(e) =
                self.recorder.event(r.step as f64, metric_names::event::REFORM, &message, EVENT_TIMEOUT)
            {
                self.errors.push(e);
            }
        }
    }

    fn evaluated(&mut self, r: &EvalReport) {
        self.record(r.step, &metric_names::f1(&r.set), r.f1);
        self.record(r.step, &metric_names::precision(&r.set), r.precision);
        self.record(r.step, &metric_names::recall(&r.set), r.recall);
    }

    fn diagnosed(&mut self, r: &DiagnoseReport) {
        self.record(r.step, metric_names::MASK_AGREEMENT, r.mask_agreement);
        self.record(r.step, metric_names::MASK_AGREEMENT_EXPECTED, r.mask_expected);
        self.record(r.step, metric_names::MASK_AGREEMENT_SIGMA, r.mask_sigma);
        self.record(r.step, metric_names::GRAD_COSINE, r.grad_cosine);
    }

    /// A point on every rank; the event (with what the alarm means) once, from
    /// rank 0.
    fn alarm(&mut self, r: &DiagnoseReport) {
        self.record(r.step, metric_names::DIVERSITY_ALARM, 1.0);
        if self.rank == 0
            && let Err(e) = self.recorder.event(
                r.step as f64,
                metric_names::event::DIVERSITY_ALARM,
                &r.masks.explain(),
                EVENT_TIMEOUT,
            )
        {
            self.errors.push(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use drove_metrics::{RecorderOptions, RecorderTarget};

    use super::*;

    #[test]
    fn steps_and_evaluations_become_points_but_not_nan() {
        // Nothing listens there: points are recorded and wait, undelivered.
        let options =
            RecorderOptions { flush_timeout: Duration::from_millis(10), ..RecorderOptions::default() };
        let recorder = MetricsRecorder::new(
            RecorderTarget { address: "127.0.0.1:9", token: None, run_id: "test", rank: 0 },
            options,
        )
        .expect("a recorder");
        let mut observer = MetricsObserver::new(recorder, 0);
        let step = StepReport {
            step: 1,
            total_steps: 2,
            epoch: 1,
            loss: f64::NAN,
            lr: 1e-4,
            grad_norm: 0.5,
            sentences_per_s: 10.0,
            tokens_per_s: 100.0,
            phases: drove_train::PhaseTimes::default(),
            world_size: 3,
            generation: 2,
        };
        observer.step(&step);
        assert_eq!(observer.recorder().delivery().recorded, 7, "every field but the NaN loss");
        let eval = EvalReport {
            set: "test".into(),
            epoch: 1,
            step: 2,
            tp: 1,
            fp: 0,
            fn_: 0,
            precision: 1.0,
            recall: 1.0,
            f1: 1.0,
            sentences: 1,
        };
        observer.evaluated(&eval);
        assert_eq!(observer.close().recorded, 10);
    }
}

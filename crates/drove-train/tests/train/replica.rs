//! `Replica`, the reusable distributed step, on a small token classifier
//! (`support::Tagger`): both placements take the step that one rank over the whole
//! batch takes (2 ranks x 8 rows = 1 x 16; 2 backward passes of 8 = 1 of 16;
//! 3 micro-batches = 1), the host and backend placements agree, a checkpoint
//! resumes the run as if it had not stopped, and ranks that load different
//! checkpoints fail together. Ranks are threads with their own communicators
//! (over shared memory); the multi-process versions run under `drove run`.
use std::path::Path;
use std::sync::OnceLock;

use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Int, Tensor, TensorData};
use drove_collective::transport::{Call, Delegate};
use drove_collective::{Collective, CommError, LocalWorld, Place, SingleProcess};
use drove_train::flat::{AdamWSettings, FlatParams};
use drove_train::{LossRead, Placement, Replica, ReplicaOptions, Schedule, TrainError};
use support::{LABELS, Tagger, tagger};

use crate::support;

type B = Autodiff<Flex>;
type Model = Tagger<B>;
const SEQ: usize = 12;
const ROWS: usize = 16;

/// Rows of made-up token ids and labels.
#[derive(Clone)]
struct Rows {
    ids: Vec<i64>,
    labels: Vec<i64>,
}

impl drove_train::Rows for Rows {
    fn rows(&self) -> usize {
        self.ids.len() / SEQ
    }
}

impl Rows {
    /// `count` rows for step `step`, starting at row `first` of that step's 16.
    fn of_step(step: usize, first: usize, count: usize) -> Rows {
        let mut s = 12345u64 + step as u64;
        let mut next = |m: u64| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % m) as i64
        };
        let ids: Vec<i64> = (0..ROWS * SEQ).map(|_| 1 + next(49)).collect();
        let labels: Vec<i64> = (0..ROWS * SEQ).map(|_| next(LABELS as u64)).collect();
        let span = first * SEQ..(first + count) * SEQ;
        Rows { ids: ids[span.clone()].to_vec(), labels: labels[span].to_vec() }
    }
}

/// Every float parameter, in module order, end to end.
fn params(model: &Model) -> Vec<f32> {
    FlatParams::read(model).unwrap().values.concat()
}

/// AdamW's epsilon is burn's default (1e-5) rather than torch's 1e-8: with
/// 1e-8, elements whose gradient is rounding noise around zero (1e-10) move by
/// a hundredth of the learning rate in a direction the order of the sums
/// decides, which says nothing about the distributed step.
fn options(placement: Placement) -> ReplicaOptions {
    ReplicaOptions {
        lr: 1e-3,
        adamw: AdamWSettings { epsilon: 1e-5, ..AdamWSettings::default() },
        schedule: Schedule::WarmupLinear { warmup: 2, total: 10 },
        clip_norm: 1.0,
        micro_batches: 1,
        placement,
        ..ReplicaOptions::default()
    }
}

/// How a rank takes its rows of a step.
#[derive(Clone, Copy)]
struct Plan {
    /// Rows per backward pass on this rank.
    rows: usize,
    /// This rank's first row of each step, before its passes.
    first: usize,
}

/// What an applied step reports that sees the gradient's scale, where the
/// parameters after clipping and AdamW cannot (both map g and 2g to one
/// update): the global loss and the global gradient norm before clipping.
#[derive(Clone, Copy, Debug)]
struct Scale {
    loss: f64,
    grad_norm: f64,
}

/// `steps` steps (from `from`) of `replica`, each of its passes over `plan.rows`
/// rows of the step's 16; returns each applied step's [`Scale`].
fn train(replica: &mut Replica<'_, B, Model>, plan: Plan, from: usize, steps: usize) -> Vec<Scale> {
    let device = Default::default();
    let passes = replica.options().backward_passes_per_step;
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut scales = Vec::new();
    for step in from..from + steps {
        for pass in 0..passes {
            let rows = Rows::of_step(step, plan.first + pass * plan.rows, plan.rows);
            let outcome = replica
                .step(&rows, |model: &Model, micro| {
                    let (r, n) = (&micro.rows, micro.rows.len());
                    let ids = TensorData::new(micro.batch.ids[r.start * SEQ..r.end * SEQ].to_vec(), [n, SEQ]);
                    let ids = Tensor::<B, 2, Int>::from_data(ids, &device);
                    let y =
                        TensorData::new(micro.batch.labels[r.start * SEQ..r.end * SEQ].to_vec(), [n * SEQ]);
                    let targets = Tensor::<B, 1, Int>::from_data(y, &device);
                    let logits = model.forward(ids);
                    loss_fn.forward(logits.reshape([n * SEQ, LABELS]), targets)
                })
                .unwrap();
            assert_eq!(outcome.applied, pass + 1 == passes, "applied only after the last pass");
            if outcome.applied {
                let scale =
                    Scale { loss: outcome.global_loss.unwrap(), grad_norm: outcome.grad_norm.unwrap() };
                assert!(scale.grad_norm > 0.0 && scale.loss > 0.0 && outcome.lr.is_some());
                scales.push(scale);
            }
        }
    }
    scales
}

/// The largest relative difference between two runs' losses and gradient
/// norms, step by step: 1.0 for a gradient doubled or halved.
fn scale_diff(a: &[Scale], b: &[Scale]) -> f64 {
    assert_eq!(a.len(), b.len(), "as many applied steps");
    let rel = |x: f64, y: f64| (x - y).abs() / x.abs().max(y.abs()).max(1e-12);
    a.iter().zip(b).map(|(a, b)| rel(a.loss, b.loss).max(rel(a.grad_norm, b.grad_norm))).fold(0.0, f64::max)
}

/// Asserts that two runs took steps of one scale: the same global loss and
/// gradient norm before clipping at every step (within the order of the sums).
fn assert_same_scale(what: &str, a: &[Scale], b: &[Scale]) {
    let d = scale_diff(a, b);
    eprintln!("{what}: loss and gradient norm differ by {d:e}");
    assert!(d <= 1e-5, "{what}: loss or gradient norm differ by {d} (relative max): {a:?} vs {b:?}");
}

fn relative_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().map(|x| x.abs()).fold(0f32, f32::max).max(1e-12);
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) / scale
}

/// The same initial weights in every call and every process: a fixed
/// pseudo-random pattern (BERT's scale, 0.02) instead of the backend's
/// generator, which other tests running at once draw from too.
fn initial() -> Model {
    static WEIGHTS: OnceLock<FlatParams> = OnceLock::new();
    let device = Default::default();
    let fresh = tagger::<B>(&device);
    let weights = WEIGHTS.get_or_init(|| {
        let mut flat = FlatParams::read(&fresh).unwrap();
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for (name, values) in flat.names.iter().zip(&mut flat.values) {
            for v in values.iter_mut() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let unit = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5; // [-0.5, 0.5)
                *v = if name.ends_with("gamma") { 1.0 + 0.1 * unit } else { 0.04 * unit };
            }
        }
        flat
    });
    weights.write(fresh, &device)
}

/// The first step's [`Scale`] computed without the replica: burn's mean
/// cross-entropy over step 0's 16 rows on the initial model, and the norm of
/// its gradient. A scale that every world size shares (the replica's loss
/// weight, its averaging) shows here, where comparing runs cannot see it.
fn first_step_by_hand() -> Scale {
    let device = Default::default();
    let model = initial();
    let rows = Rows::of_step(0, 0, ROWS);
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(rows.ids, [ROWS, SEQ]), &device);
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(rows.labels, [ROWS * SEQ]), &device);
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(model.forward(ids).reshape([ROWS * SEQ, LABELS]), targets);
    let value = f64::from(loss.clone().into_scalar());
    let mut grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
    let grads = drove_train::flat::take_gradients(&model, &mut grads).unwrap();
    assert_eq!(grads.len(), FlatParams::read(&model).unwrap().names.len(), "every parameter's gradient");
    Scale { loss: value, grad_norm: drove_train::flat::global_norm(&grads) }
}

#[test]
fn the_first_step_s_loss_and_gradient_norm_are_those_of_the_batch_by_hand() {
    let by_hand = first_step_by_hand();
    for placement in [Placement::Host, Placement::Backend] {
        let (_, scales) = alone(options(placement));
        assert_same_scale(&format!("{placement}: alone vs by hand"), &[by_hand], &scales[..1]);
        let ranks = world(2, move |rank, comm| {
            let opts = ReplicaOptions { lr: 1e-3 / 2.0, ..options(placement) };
            let mut replica = Replica::new(initial(), comm, opts, &Default::default()).unwrap();
            train(&mut replica, Plan { rows: 8, first: rank * 8 }, 0, 1)
        });
        for (rank, trail) in ranks.iter().enumerate() {
            assert_same_scale(&format!("{placement}: rank {rank} of 2 x 8 vs by hand"), &[by_hand], trail);
        }
    }
}

/// Five steps alone over all 16 rows per step, with `opts`: the parameters
/// and each step's [`Scale`].
fn alone(opts: ReplicaOptions) -> (Vec<f32>, Vec<Scale>) {
    let mut replica = Replica::new(initial(), &SingleProcess, opts, &Default::default()).unwrap();
    let scales = train(&mut replica, Plan { rows: ROWS, first: 0 }, 0, 5);
    assert_eq!(replica.steps(), 5);
    (params(replica.model()), scales)
}

/// Runs `work(rank, comm)` on `world` thread ranks of one in-process world.
fn world<T: Send + 'static>(
    world: usize,
    work: impl Fn(usize, &LocalWorld) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let work = std::sync::Arc::new(work);
    let handles: Vec<_> = LocalWorld::new(world)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let work = work.clone();
            std::thread::spawn(move || work(rank, &comm))
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

#[test]
fn two_ranks_of_8_take_the_step_of_one_of_16_in_both_placements() {
    let moved = relative_diff(&alone(options(Placement::Host)).0, &params(&initial()));
    assert!(moved > 1e-4, "training moved the parameters by only {moved}");
    for placement in [Placement::Host, Placement::Backend] {
        let (single, scales) = alone(options(placement));
        let ranks = world(2, move |rank, comm| {
            // Rank 1 starts from other random weights: the broadcast must fix that.
            let model = if rank == 0 { initial() } else { tagger(&Default::default()) };
            let opts = ReplicaOptions { lr: 1e-3 / 2.0, ..options(placement) }; // linear scaling doubles it
            let mut replica = Replica::new(model, comm, opts, &Default::default()).unwrap();
            let scales = train(&mut replica, Plan { rows: 8, first: rank * 8 }, 0, 5);
            (params(replica.model()), scales)
        });
        // The parameters cannot see a uniform scale of the gradient once
        // clipping and AdamW divide it out; the loss and the norm before
        // clipping can.
        for (rank, (_, trail)) in ranks.iter().enumerate() {
            assert_same_scale(&format!("{placement}: rank {rank} of 2 x 8 vs 1 x 16"), &scales, trail);
        }
        assert_eq!(
            relative_diff(&ranks[0].0, &ranks[1].0),
            0.0,
            "{placement}: ranks hold identical parameters"
        );
        let d = relative_diff(&single, &ranks[0].0);
        eprintln!("{placement}: 2 x 8 vs 1 x 16: {d:e}");
        assert!(d <= 1e-5, "{placement}: 2 x 8 differs from 1 x 16 by {d} (relative max)");
    }
}

#[test]
fn host_and_backend_placements_take_the_same_steps() {
    let ((host, host_scales), (backend, backend_scales)) =
        (alone(options(Placement::Host)), alone(options(Placement::Backend)));
    assert_same_scale("host vs backend", &host_scales, &backend_scales);
    let d = relative_diff(&host, &backend);
    eprintln!("host vs backend: {d:e}");
    assert!(d <= 1e-5, "host and backend placements differ by {d} after 5 steps");
    // The bound can fail: four steps are outside it.
    let mut short =
        Replica::new(initial(), &SingleProcess, options(Placement::Host), &Default::default()).unwrap();
    train(&mut short, Plan { rows: ROWS, first: 0 }, 0, 4);
    let moved = relative_diff(&host, &params(short.model()));
    eprintln!("the fifth step moved the parameters by {moved:e}");
    assert!(moved > 1e-5, "the last step moved the parameters by only {moved}: the bound would not tell");
}

#[test]
fn two_backward_passes_of_8_equal_one_of_16() {
    for placement in [Placement::Host, Placement::Backend] {
        let (whole, scales) = alone(options(placement));
        let opts = ReplicaOptions { backward_passes_per_step: 2, ..options(placement) };
        let mut replica = Replica::new(initial(), &SingleProcess, opts, &Default::default()).unwrap();
        let passes = train(&mut replica, Plan { rows: 8, first: 0 }, 0, 5);
        assert_eq!(replica.steps(), 5, "two passes make one step");
        assert_same_scale(&format!("{placement}: 2 passes x 8 vs 1 x 16"), &scales, &passes);
        let d = relative_diff(&whole, &params(replica.model()));
        eprintln!("{placement}: 2 passes x 8 vs 1 x 16: {d:e}");
        assert!(d <= 1e-5, "{placement}: 2 passes x 8 differ from 1 x 16 by {d}");
    }
}

#[test]
fn micro_batches_sum_to_the_whole_batch() {
    for placement in [Placement::Host, Placement::Backend] {
        let (whole, scales) = alone(options(placement));
        let (split, split_scales) = alone(ReplicaOptions { micro_batches: 3, ..options(placement) });
        assert_same_scale(&format!("{placement}: 3 micro-batches vs 1"), &scales, &split_scales);
        let d = relative_diff(&whole, &split);
        eprintln!("{placement}: 3 micro-batches vs 1: {d:e}");
        assert!(d <= 1e-5, "{placement}: 3 micro-batches differ from 1 by {d}");
    }
}

/// Three steps, a checkpoint, then two more in a fresh replica (placed as
/// `then`) loaded from it: the five steps of an uninterrupted run.
fn resumed(first: Placement, then: Placement, dir: &Path) -> Vec<f32> {
    let plan = Plan { rows: ROWS, first: 0 };
    let mut replica = Replica::new(initial(), &SingleProcess, options(first), &Default::default()).unwrap();
    train(&mut replica, plan, 0, 3);
    let saved = replica.save(dir, &serde_json::json!({ "next_step": 3 }), &[], 2).unwrap();
    assert_eq!(saved.unwrap(), dir.join("step-00000003"));
    // Another model altogether until the checkpoint is loaded, which has
    // taken a step of its own (the device optimizer then holds its buffer).
    let other = tagger(&Default::default());
    let mut replica = Replica::new(other, &SingleProcess, options(then), &Default::default()).unwrap();
    train(&mut replica, plan, 0, 1);
    let state = replica.load(&dir.join("step-00000003")).unwrap();
    assert_eq!(state["next_step"], 3);
    assert_eq!(replica.steps(), 3);
    train(&mut replica, plan, 3, 2);
    params(replica.model())
}

#[test]
fn a_checkpoint_resumes_the_run_in_either_placement() {
    let (straight, _) = alone(options(Placement::Host));
    for (first, then) in [
        (Placement::Host, Placement::Host),
        (Placement::Backend, Placement::Backend),
        (Placement::Host, Placement::Backend),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = relative_diff(&straight, &resumed(first, then, dir.path()));
        assert!(d <= 1e-5, "saved {first}, resumed {then}: differs from the straight run by {d}");
    }
}

#[test]
fn ranks_that_load_different_checkpoints_fail_together() {
    let dir = tempfile::tempdir().unwrap();
    for (steps, name) in [(1, "a"), (2, "b")] {
        let mut replica =
            Replica::new(initial(), &SingleProcess, options(Placement::Host), &Default::default()).unwrap();
        train(&mut replica, Plan { rows: ROWS, first: 0 }, 0, steps);
        replica.save(&dir.path().join(name), &serde_json::json!({}), &[], 1).unwrap();
    }
    let root = dir.path().to_path_buf();
    let errors = world(2, move |rank, comm| {
        let mut replica =
            Replica::new(initial(), comm, options(Placement::Host), &Default::default()).unwrap();
        let ckpt = if rank == 0 { root.join("a/step-00000001") } else { root.join("b/step-00000002") };
        let err = replica.load(&ckpt).unwrap_err();
        assert!(matches!(err, TrainError::Disagree(_)), "{err}");
        err.to_string()
    });
    for e in &errors {
        assert!(e.contains("rank(s) [1]") && e.contains("other parameters"), "{e}");
    }
    // One rank that cannot read it: that rank gets its own error, the others name it.
    let root = dir.path().to_path_buf();
    let errors = world(2, move |rank, comm| {
        let mut replica =
            Replica::new(initial(), comm, options(Placement::Host), &Default::default()).unwrap();
        let ckpt = if rank == 0 { root.join("a/step-00000001") } else { root.join("nowhere") };
        replica.load(&ckpt).unwrap_err().to_string()
    });
    assert!(errors[0].contains("rank(s) [1] could not load"), "{}", errors[0]);
    assert!(errors[1].contains("nowhere/state.json"), "{}", errors[1]);
}

#[test]
fn bad_options_are_named_before_anything_moves() {
    let opts = ReplicaOptions { lr: f64::NAN, ..ReplicaOptions::default() };
    let err =
        Replica::new(initial(), &SingleProcess as &dyn Collective, opts, &Default::default()).err().unwrap();
    assert!(err.to_string().contains("lr must be a finite number"), "{err}");
    let mut replica =
        Replica::new(initial(), &SingleProcess, ReplicaOptions::default(), &Default::default()).unwrap();
    let err = replica.apply().unwrap_err().to_string();
    assert!(err.contains("backward pass first"), "{err}");
}

/// Writes a checkpoint as the trainer before `Replica` laid it out, by hand:
/// `model.safetensors` by parameter name, `optimizer.safetensors` with `m.` and
/// `v.` moments, and the NER loop's `state.json` with `optimizer_step`.
fn write_previous_layout(dir: &Path, weights: &FlatParams, step: u64) {
    use safetensors::tensor::{Dtype, TensorView};
    std::fs::create_dir_all(dir).unwrap();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let model: Vec<(String, Vec<usize>, Vec<u8>)> = weights
        .names
        .iter()
        .zip(&weights.shapes)
        .zip(&weights.values)
        .map(|((n, s), v)| (n.clone(), s.clone(), bytes(v)))
        .collect();
    let moments: Vec<(String, Vec<usize>, Vec<u8>)> = weights
        .names
        .iter()
        .zip(&weights.shapes)
        .zip(&weights.values)
        .flat_map(|((n, s), v)| {
            let m: Vec<f32> = v.iter().map(|x| x * 0.1).collect();
            let v2: Vec<f32> = v.iter().map(|x| x * x).collect();
            [(format!("m.{n}"), s.clone(), bytes(&m)), (format!("v.{n}"), s.clone(), bytes(&v2))]
        })
        .collect();
    for (file, tensors) in [("model.safetensors", model), ("optimizer.safetensors", moments)] {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, s, b)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(file)).unwrap();
    }
    let state = serde_json::json!({
        "epoch": 0, "batch": 3, "global_step": step, "world_size": 1, "batch_size": 16,
        "seed": 42, "train_sentences": 16, "history": [], "optimizer_step": step,
    });
    std::fs::write(dir.join("state.json"), state.to_string()).unwrap();
}

#[test]
fn a_checkpoint_in_the_previous_layout_resumes_in_both_placements() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("step-00000003");
    let mut saved = FlatParams::read(&initial()).unwrap();
    saved.values.iter_mut().flatten().for_each(|x| *x += 0.25);
    write_previous_layout(&ckpt, &saved, 3);
    for placement in [Placement::Host, Placement::Backend] {
        let mut replica =
            Replica::new(initial(), &SingleProcess, options(placement), &Default::default()).unwrap();
        let state = replica.load(&ckpt).unwrap();
        assert_eq!((state["global_step"].as_u64(), replica.steps()), (Some(3), 3), "{placement}");
        assert_eq!(FlatParams::read(replica.model()).unwrap().values, saved.values, "{placement}");
        // And it trains on from there, both placements alike.
        train(&mut replica, Plan { rows: ROWS, first: 0 }, 3, 1);
    }
    // Without the optimizer's step it is not a checkpoint this version can resume.
    let state = std::fs::read_to_string(ckpt.join("state.json")).unwrap();
    std::fs::write(ckpt.join("state.json"), state.replace("\"optimizer_step\":3", "\"old\":3")).unwrap();
    let mut replica =
        Replica::new(initial(), &SingleProcess, options(Placement::Host), &Default::default()).unwrap();
    let err = replica.load(&ckpt).unwrap_err().to_string();
    assert!(err.contains("state.json") && err.contains("optimizer_step is missing"), "{err}");
}

/// A collective whose world is replaced between steps, as an elastic run's
/// is (drove-control's membership client does this through a coordinator).
struct Swap(std::sync::RwLock<Option<LocalWorld>>);

impl Swap {
    fn replace(&self, next: LocalWorld) {
        let old = self.0.write().unwrap().replace(next);
        drop(old);
    }
}

impl Delegate for Swap {
    fn place(&self) -> Place {
        let comm = self.0.read().unwrap();
        let comm = comm.as_ref().expect("a world");
        Place::new(comm.rank(), comm.world_size()).unwrap()
    }
    fn delegate<R>(
        &self,
        _call: Call<'_>,
        run: impl FnOnce(&dyn Collective) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        run(self.0.read().unwrap().as_ref().expect("a world"))
    }
}

/// The ranks of one in-process world, each taken once by its thread.
struct Seats(std::sync::Mutex<Vec<Option<LocalWorld>>>);

impl Seats {
    fn new(world: usize) -> std::sync::Arc<Seats> {
        let ranks = LocalWorld::new(world).unwrap().into_iter().map(Some).collect();
        std::sync::Arc::new(Seats(std::sync::Mutex::new(ranks)))
    }
    fn take(&self, rank: usize) -> LocalWorld {
        self.0.lock().unwrap()[rank].take().expect("each rank is taken once")
    }
}

#[test]
#[allow(clippy::too_many_lines)]
fn a_member_joining_a_re_formed_world_takes_the_most_advanced_state() {
    for placement in [Placement::Host, Placement::Backend] {
        let (first, second) = (Seats::new(2), Seats::new(3));
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let (first, second) = (first.clone(), second.clone());
                std::thread::spawn(move || {
                    let opts = ReplicaOptions { lr: 1e-3 / 2.0, ..options(placement) };
                    let device = Default::default();
                    let swap = Swap(std::sync::RwLock::new(None));
                    let (mut replica, trained, mut state) = if rank < 2 {
                        // Generation 1: two members train three steps.
                        swap.replace(first.take(rank));
                        let mut replica = Replica::new(initial(), &swap, opts, &device).unwrap();
                        train(&mut replica, Plan { rows: 8, first: rank * 8 }, 0, 3);
                        let trained = params(replica.model());
                        let state = if rank == 0 { [7, 24] } else { [0, 0] };
                        swap.replace(second.take(rank));
                        (replica, Some(trained), state)
                    } else {
                        // A new member, with other random weights, joins generation 2.
                        swap.replace(second.take(2));
                        let replica = Replica::joining(tagger(&device), &swap, opts, &device).unwrap();
                        (replica, None, [0, 0])
                    };
                    let resynced = replica.resync(&mut state).unwrap();
                    let synced = params(replica.model());
                    train(&mut replica, Plan { rows: 4, first: rank * 4 }, 3, 1);
                    (resynced, state, trained, synced, replica.steps(), params(replica.model()))
                })
            })
            .collect();
        let ranks: Vec<_> = handles.into_iter().map(|h| h.join().expect("rank thread")).collect();
        let trained = ranks[0].2.clone().unwrap();
        for (rank, (resynced, state, _, synced, steps, after)) in ranks.iter().enumerate() {
            assert_eq!((resynced.source, resynced.step), (0, 3), "{placement} rank {rank}");
            assert_eq!(resynced.behind, vec![2], "{placement} rank {rank}: only the joiner was behind");
            assert_eq!(resynced.fingerprint, ranks[0].0.fingerprint, "{placement} rank {rank}");
            assert_eq!(*state, [7, 24], "{placement} rank {rank}: the loop state of the source");
            assert_eq!(
                relative_diff(synced, &trained),
                0.0,
                "{placement} rank {rank}: the trained parameters"
            );
            assert_eq!(*steps, 4, "{placement} rank {rank}: the schedule goes on from step 3");
            assert_eq!(
                relative_diff(after, &ranks[0].5),
                0.0,
                "{placement} rank {rank}: one step at world 3"
            );
        }
        assert!(
            relative_diff(&ranks[2].5, &trained) > 1e-6,
            "{placement}: the fourth step moved the parameters"
        );
    }
}

/// What makes a poisoned step not finite.
#[derive(Clone, Copy, Debug)]
enum Poison {
    /// The loss itself is NaN.
    Loss,
    /// The loss is finite and its gradient is not (sqrt's slope at 0).
    Norm,
}

/// One step of all 16 rows of step `step`, the loss `poison`ed if given.
fn step_of(
    replica: &mut Replica<'_, B, Model>,
    step: usize,
    poison: Option<Poison>,
) -> Result<(), TrainError> {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let rows = Rows::of_step(step, 0, ROWS);
    replica
        .step(&rows, |model: &Model, micro| {
            let (r, n) = (&micro.rows, micro.rows.len());
            let ids = TensorData::new(micro.batch.ids[r.start * SEQ..r.end * SEQ].to_vec(), [n, SEQ]);
            let y = TensorData::new(micro.batch.labels[r.start * SEQ..r.end * SEQ].to_vec(), [n * SEQ]);
            let logits = model.forward(Tensor::<B, 2, Int>::from_data(ids, &device));
            let zero = logits.clone().sum().mul_scalar(0.0);
            let loss = loss_fn.forward(logits.reshape([n * SEQ, LABELS]), Tensor::from_data(y, &device));
            match poison {
                None => loss,
                Some(Poison::Loss) => loss.mul_scalar(f64::NAN),
                Some(Poison::Norm) => loss + zero.sqrt(),
            }
        })
        .map(|_| ())
}

#[test]
fn a_step_whose_loss_or_gradient_norm_is_not_finite_changes_nothing_however_the_loss_is_read() {
    let device = Default::default();
    for placement in [Placement::Host, Placement::Backend] {
        let mut clean = Replica::new(initial(), &SingleProcess, options(placement), &device).unwrap();
        for step in 0..2 {
            step_of(&mut clean, step, None).unwrap();
        }
        for loss_read in [LossRead::AtUpdate, LossRead::AfterForward] {
            for poison in [Poison::Loss, Poison::Norm] {
                let what = format!("{placement}, loss read {loss_read}, {poison:?}");
                let opts = ReplicaOptions { loss_read, ..options(placement) };
                let mut replica = Replica::new(initial(), &SingleProcess, opts, &device).unwrap();
                step_of(&mut replica, 0, None).unwrap();
                let before = params(replica.model());
                let err = step_of(&mut replica, 1, Some(poison)).expect_err(&what);
                let named = match poison {
                    Poison::Loss => "loss",
                    Poison::Norm => "global gradient norm",
                };
                match &err {
                    TrainError::NonFinite { step: 2, what: w, .. } if *w == named => {}
                    other => panic!("{what}: expected step 2's {named} named, got {other}"),
                }
                assert_eq!(replica.steps(), 1, "{what}: the refused step is not counted");
                assert!(params(replica.model()) == before, "{what}: the parameters moved");
                // The moments and step count did not move either: the next
                // step is that of a run that never saw the poisoned one.
                step_of(&mut replica, 1, None).unwrap();
                assert!(params(replica.model()) == params(clean.model()), "{what}: the state moved");
            }
        }
    }
}

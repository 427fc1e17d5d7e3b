//! The all-reduce overlapped with backward (`ReplicaOptions::overlap`): the
//! same parameters as the non-overlapped step, bit for bit, at 2 and 3
//! ranks, in both placements, with micro-batches and gradient accumulation;
//! and the first bucket's all-reduce starts before backward ends; the
//! embedding sent as the rows the batch touched gives the dense all-reduce's
//! parameters bit for bit, overlapped or not. Ranks are
//! threads with their own communicators over shared memory; the
//! multi-process version runs under `drove run` (drove-cli's system tests).
use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use drove_collective::LocalWorld;
use drove_collective::fusion::FusionOptions;
use drove_train::flat::FlatParams;
use drove_train::timeline::{Timeline, Track};
use drove_train::{Micro, NoLocalGradient, Placement, Replica, ReplicaOptions, SparseRows, TrainError};

type B = Autodiff<Flex>;
type Model = Deep<B>;
const SEQ: usize = 12;
const LABELS: usize = 5;
const WIDTH: usize = 16;
/// Rows of the embedding table; batches use ids 1 to 49, so the rows the
/// ranks touch add up to fewer than the table.
const VOCAB: usize = 400;

/// A residual block: `norm(tanh(linear(x)) + x)` (`x` has two consumers, so
/// its gradient is a sum whose order the hooks must not change).
#[derive(Module, Debug)]
struct Block<B: Backend> {
    linear: Linear<B>,
    norm: LayerNorm<B>,
}

/// An embedding, three residual blocks and a classifier: deep enough that
/// most parameters are finished well before backward ends.
#[derive(Module, Debug)]
struct Deep<B: Backend> {
    embedding: Embedding<B>,
    blocks: Vec<Block<B>>,
    classifier: Linear<B>,
}

impl<B: Backend> Deep<B> {
    fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let mut x = self.embedding.forward(ids);
        for block in &self.blocks {
            x = block.norm.forward(block.linear.forward(x.clone()).tanh() + x);
        }
        self.classifier.forward(x)
    }
}

/// The model with the same weights in every call: a fixed pseudo-random
/// pattern instead of the backend's generator.
fn initial() -> Model {
    let device = Default::default();
    let fresh = tagger::<B>(&device);
    let mut flat = FlatParams::read(&fresh).unwrap();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for values in &mut flat.values {
        for v in values.iter_mut() {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *v = 0.2 * ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5);
        }
    }
    flat.write(fresh, &device)
}

fn tagger<B: Backend>(device: &B::Device) -> Deep<B> {
    let block = || Block {
        linear: LinearConfig::new(WIDTH, WIDTH).init(device),
        norm: LayerNormConfig::new(WIDTH).init(device),
    };
    Deep {
        embedding: EmbeddingConfig::new(VOCAB, WIDTH).init(device),
        blocks: vec![block(), block(), block()],
        classifier: LinearConfig::new(WIDTH, LABELS).init(device),
    }
}

/// Rows of made-up token ids and labels, different on every rank and step.
struct Rows {
    ids: Vec<i64>,
    labels: Vec<i64>,
}

impl drove_train::Rows for Rows {
    fn rows(&self) -> usize {
        self.ids.len() / SEQ
    }
}

fn rows(seed: u64, count: usize) -> Rows {
    let mut s = 0x5eed_u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = |m: u64| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 33) % m) as i64
    };
    let ids = (0..count * SEQ).map(|_| 1 + next(49)).collect();
    let labels = (0..count * SEQ).map(|_| next(LABELS as u64)).collect();
    Rows { ids, labels }
}

/// The bits of every parameter, end to end.
fn bits(model: &Model) -> Vec<u32> {
    FlatParams::read(model).unwrap().values.concat().iter().map(|x| x.to_bits()).collect()
}

/// Small buckets, so that a step has several.
fn options(placement: Placement, overlap: bool, micro_batches: usize, passes: usize) -> ReplicaOptions {
    ReplicaOptions {
        lr: 1e-2,
        clip_norm: 1.0,
        micro_batches,
        backward_passes_per_step: passes,
        fusion: FusionOptions { threshold_bytes: 512, ..FusionOptions::default() },
        placement,
        overlap,
        // The test's table is small: dense unless a test asks for rows.
        sparse_rows: SparseRows::off(),
        ..ReplicaOptions::default()
    }
}

/// Every rank's timeline of `steps` steps of `model` with `opts` (2 ranks).
fn timelines(model: Model, opts: ReplicaOptions, steps: usize) -> Vec<Vec<drove_train::timeline::Span>> {
    let handles: Vec<_> = LocalWorld::new(2)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let (model, opts) = (model.clone(), opts.clone());
            std::thread::spawn(move || {
                let timeline = Timeline::on();
                let mut replica =
                    Replica::new(model, &comm, opts, &Default::default()).unwrap().with_timeline(&timeline);
                train(&mut replica, rank, steps);
                drop(replica);
                timeline.spans()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

/// `steps` steps of `replica` on rank `rank`'s rows; returns the bits of each
/// applied step's global loss and gradient norm before clipping, which see a
/// gradient's scale where the parameters after clipping and AdamW do not.
fn train(replica: &mut Replica<'_, B, Model>, rank: usize, steps: usize) -> Vec<(u64, u64)> {
    let passes = replica.options().backward_passes_per_step;
    let mut scales = Vec::new();
    for step in 0..steps {
        for pass in 0..passes {
            let batch = rows((step * passes + pass) as u64 * 31 + rank as u64, 8);
            let outcome = replica.step(&batch, micro_loss).unwrap();
            if outcome.applied {
                scales.push((outcome.global_loss.unwrap().to_bits(), outcome.grad_norm.unwrap().to_bits()));
            }
        }
    }
    scales
}

/// The cross-entropy of micro-batch `micro`'s rows.
fn micro_loss(model: &Model, micro: &Micro<'_, Rows>) -> Tensor<B, 1> {
    let device = Default::default();
    let (r, n) = (&micro.rows, micro.rows.len());
    let ids = TensorData::new(micro.batch.ids[r.start * SEQ..r.end * SEQ].to_vec(), [n, SEQ]);
    let ids = Tensor::<B, 2, Int>::from_data(ids, &device);
    let y = TensorData::new(micro.batch.labels[r.start * SEQ..r.end * SEQ].to_vec(), [n * SEQ]);
    let targets = Tensor::<B, 1, Int>::from_data(y, &device);
    CrossEntropyLossConfig::new()
        .init(&device)
        .forward(model.forward(ids).reshape([n * SEQ, LABELS]), targets)
}

/// What one rank ends with: its parameters' bits, what its replica said of its
/// overlap, and the bits of each step's global loss and gradient norm.
type Ended = (Vec<u32>, (bool, usize), Vec<(u64, u64)>);

/// Every rank's parameters after `steps` steps with `opts`, what each replica
/// said of its overlap, and each step's loss and gradient norm.
fn run(world: usize, opts: ReplicaOptions, steps: usize) -> Vec<Ended> {
    let handles: Vec<_> = LocalWorld::new(world)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let opts = opts.clone();
            std::thread::spawn(move || {
                let mut replica = Replica::new(initial(), &comm, opts, &Default::default()).unwrap();
                let scales = train(&mut replica, rank, steps);
                (bits(replica.model()), replica.overlapping(), scales)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

#[test]
fn overlapped_steps_give_the_same_parameters_bit_for_bit_at_2_and_3_ranks() {
    for world in [2, 3] {
        for placement in [Placement::Host, Placement::Backend] {
            for (micro, passes) in [(1, 1), (2, 2)] {
                let what = format!("{world} ranks, {placement}, {micro} micro-batch(es), {passes} pass(es)");
                let steps = 4;
                let plain = run(world, options(placement, false, micro, passes), steps);
                let overlapped = run(world, options(placement, true, micro, passes), steps);
                let (on, hooked) = overlapped[0].1;
                assert!(on && hooked >= 8, "{what}: overlap on with {hooked} hooked parameters");
                assert_eq!(plain[0].1, (false, 0), "{what}: overlap off");
                for (rank, (params, _, scales)) in overlapped.iter().enumerate() {
                    assert_eq!(scales.len(), steps, "{what}: rank {rank}: every step applied");
                    assert_eq!(
                        scales, &plain[0].2,
                        "{what}: rank {rank}: the loss and gradient norm (bits) of the plain step"
                    );
                    let differ = params.iter().zip(&plain[0].0).filter(|(a, b)| a != b).count();
                    assert_eq!(
                        differ,
                        0,
                        "{what}: rank {rank}: {differ} of {} parameters differ from the plain step",
                        params.len()
                    );
                }
                assert_ne!(plain[0].0, bits(&initial()), "{what}: training moved nothing");
            }
        }
    }
}

#[test]
fn the_first_bucket_is_reduced_while_backward_goes_on() {
    let timelines = timelines(tagger::<B>(&Default::default()), options(Placement::Host, true, 1, 1), 3);
    for (rank, spans) in timelines.iter().enumerate() {
        let buckets: Vec<_> = spans.iter().filter(|s| s.track == Track::Engine).collect();
        let backward: Vec<_> = spans.iter().filter(|s| s.name == "backward").collect();
        // Three steps, the first measures: two overlapped ones.
        assert_eq!(backward.len(), 3, "rank {rank}: {backward:?}");
        assert!(buckets.len() >= 2 * 4, "rank {rank}: at least four buckets a step: {buckets:?}");
        for last in &backward[1..] {
            let of_step: Vec<_> = buckets
                .iter()
                .filter(|b| b.start_us >= last.start_us && b.start_us <= last.end_us + 1_000_000)
                .collect();
            let first = of_step.iter().map(|b| b.start_us).min().expect("buckets in the step");
            assert!(
                first < last.end_us,
                "rank {rank}: the first bucket was whole at {first} us, after backward ended at {} us",
                last.end_us
            );
            assert!(of_step[0].name.starts_with("gradients.bucket"), "{:?}", of_step[0]);
            // Backward's levels, inside the backward span, each named for the
            // module whose gradients it finished, the classifier's first.
            let levels: Vec<_> = spans
                .iter()
                .filter(|s| s.track == Track::Micro(0) && s.name.starts_with("backward "))
                .filter(|s| s.start_us >= last.start_us && s.end_us <= last.end_us)
                .collect();
            assert!(levels.len() >= 3, "rank {rank}: the classifier's and the blocks' levels: {levels:?}");
            assert_eq!(levels[0].name, "backward classifier", "{levels:?}");
            assert!(levels.windows(2).all(|w| w[0].end_us <= w[1].start_us), "in order: {levels:?}");
        }
    }
}

#[test]
fn the_embedding_sent_as_its_rows_gives_the_dense_parameters_bit_for_bit() {
    let rows = SparseRows { min_bytes: 0, ..SparseRows::default() };
    for world in [2, 3] {
        for placement in [Placement::Host, Placement::Backend] {
            let what = format!("{world} ranks, {placement}");
            let dense = run(world, options(placement, false, 2, 1), 3);
            for overlap in [false, true] {
                let sparse = run(
                    world,
                    ReplicaOptions { sparse_rows: rows.clone(), ..options(placement, overlap, 2, 1) },
                    3,
                );
                for (rank, (params, _, scales)) in sparse.iter().enumerate() {
                    assert_eq!(
                        scales, &dense[0].2,
                        "{what}, overlap {overlap}: rank {rank}: the loss and gradient norm (bits) of dense"
                    );
                    let differ = params.iter().zip(&dense[0].0).filter(|(a, b)| a != b).count();
                    assert_eq!(
                        differ, 0,
                        "{what}, overlap {overlap}: rank {rank}: {differ} values differ from dense"
                    );
                }
            }
            assert_ne!(dense[0].0, bits(&initial()), "{what}: training moved nothing");
        }
    }
}

#[test]
fn the_embedding_rows_are_gathered_on_the_engine() {
    let sparse_rows = SparseRows { min_bytes: 0, ..SparseRows::default() };
    let opts = ReplicaOptions { sparse_rows, ..options(Placement::Host, true, 1, 1) };
    for spans in timelines(initial(), opts, 2) {
        let rows: Vec<_> = spans
            .iter()
            .filter(|s| s.track == Track::Engine && s.name.ends_with("rows all-gather"))
            .collect();
        // Two steps (the first measures, through the engine too), one table,
        // the first parameter: the plan's first bucket.
        assert_eq!(rows.len(), 2, "two steps, one table: {spans:?}");
        assert_eq!(rows[0].name, "gradients.bucket0 rows all-gather");
    }
}

/// Each rank's local gradient of `kept` (before the average) at each of
/// `steps` steps, read between the backward pass and the update, with
/// `opts`, whose `keep_local_gradient` names `kept` or nothing.
fn local_gradients(opts: ReplicaOptions, kept: usize, steps: usize) -> Vec<Vec<Result<Vec<u32>, String>>> {
    let handles: Vec<_> = LocalWorld::new(2)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let opts = opts.clone();
            std::thread::spawn(move || {
                let mut replica = Replica::new(initial(), &comm, opts, &Default::default()).unwrap();
                (0..steps)
                    .map(|step| {
                        replica.backward(&rows(step as u64 * 31 + rank as u64, 8), micro_loss).unwrap();
                        let local = replica.local_gradient(kept).map_err(|e| match e {
                            TrainError::NoLocalGradient { why, .. } => format!("{why:?}"),
                            other => panic!("not the error of a gradient not kept: {other}"),
                        });
                        replica.apply().unwrap();
                        local.map(|g| g.iter().map(|x| x.to_bits()).collect())
                    })
                    .collect()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
}

/// `ReplicaOptions::keep_local_gradient`: an overlapped pass keeps the named
/// parameter's local gradient, bit for bit the plain pass's, in both
/// placements; without it the overlapped steps say why there is none.
#[test]
fn an_overlapped_pass_keeps_the_local_gradient_the_options_name() {
    let names = drove_train::flat::parameter_names::<B, _>(&initial());
    let kept = names.iter().position(|n| n == "blocks.1.linear.weight").expect("the parameter");
    for placement in [Placement::Host, Placement::Backend] {
        let keep = |overlap| ReplicaOptions {
            keep_local_gradient: Some(names[kept].clone()),
            ..options(placement, overlap, 2, 1)
        };
        let plain = local_gradients(keep(false), kept, 3);
        let overlapped = local_gradients(keep(true), kept, 3);
        assert!(plain.iter().flatten().all(Result::is_ok), "{placement}: plain passes have it: {plain:?}");
        assert_ne!(plain[0], plain[1], "{placement}: the ranks' local gradients differ");
        assert_eq!(overlapped, plain, "{placement}: the overlapped passes keep the plain passes' gradient");
        let unkept = local_gradients(options(placement, true, 2, 1), kept, 3);
        // Step 1 measures (through the engine without hooks); 2 and 3 overlap.
        let averaged = vec![Err(format!("{:?}", NoLocalGradient::Averaged)); 3];
        assert_eq!(unkept, vec![averaged; 2], "{placement}: an overlapped pass keeps none unless named");
    }
}

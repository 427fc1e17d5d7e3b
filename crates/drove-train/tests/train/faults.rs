//! A rank lost in the middle of a step: while the overlapped all-reduce has
//! buckets in flight, between the row-sparse all-reduce's two all-gathers,
//! in its dense fallback, and a rank whose backward stops early. Every rank
//! returns (the lost one hangs up as a dead process's connections close, or
//! the others' deadline passes), its error names the op and the lost rank,
//! the step's gradients are not applied, and the step redone in a new world
//! gives the parameters of a run that never failed, bit for bit.
//!
//! Ranks are threads over `LocalWorld`; the fault is drove-collective's
//! `Faulty`, which loses a rank at an op named as the replica names them
//! (`gradients.bucket{b}`, `.rows`, `.values`, `step.loss`), so these tests
//! hold through the public seams (`Collective`, `Replica`) whatever the
//! gradient path's internals. The same fault kills a real rank process
//! mid-backward in drove-cli's system tests (`--fail-in-backward`).
use std::sync::RwLock;
use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::tensor::{Int, Tensor, TensorData};
use drove_collective::fault::{Faulty, Trigger};
use drove_collective::fusion::FusionOptions;
use drove_collective::transport::{Call, Delegate};
use drove_collective::{Collective, CommError, LocalWorld, Place};
use drove_train::flat::FlatParams;
use drove_train::{Placement, Replica, ReplicaOptions, SparseRows, TrainError};

use crate::support::Tagger;

type B = Autodiff<Flex>;
type Model = Tagger<B>;
const SEQ: usize = 6;
const LABELS: usize = 5;
const WIDTH: usize = 8;
/// Batches use token ids 1 to 49: a table of 400 rows goes as rows at 2
/// ranks, one of 50 goes dense (the ranks' rows outnumber it).
const IDS: u64 = 49;
/// How long a rank waits for the others where a lost rank hangs up: never
/// reached, the peers fail when it hangs up.
const GENEROUS: Duration = Duration::from_secs(300);
/// The deadline where a lost rank stays silent: what the others wait before
/// they name it. Long enough that no healthy op on a busy machine reaches it.
const DEADLINE: Duration = Duration::from_secs(10);
/// The ranks of the tests' worlds; rank 1 is lost.
const WORLD: usize = 2;
const VICTIM: usize = 1;
/// The step (from 0) that fails: the first measures, the second overlaps.
const FAILING: usize = 1;
/// Steps of a run.
const STEPS: usize = 3;

/// The model with the same weights in every call (a fixed pattern, not the
/// backend's generator), with an embedding of `vocab` rows.
fn initial(vocab: usize) -> Model {
    let device = Default::default();
    let fresh = Tagger::new(vocab, WIDTH, LABELS, &device);
    let mut flat = FlatParams::read(&fresh).unwrap();
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for v in flat.values.iter_mut().flatten() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *v = 0.2 * ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5);
    }
    flat.write(fresh, &device)
}

/// Rows of made-up token ids and labels.
struct Rows {
    ids: Vec<i64>,
    labels: Vec<i64>,
}

impl drove_train::Rows for Rows {
    fn rows(&self) -> usize {
        self.ids.len() / SEQ
    }
}

/// Rank `rank`'s 8 rows of pass `pass` of step `step`: different on every one.
fn rows(step: usize, pass: usize, rank: usize) -> Rows {
    let seed = ((step * 2 + pass) * 31 + rank) as u64;
    let mut s = 0x5eed_u64 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = |m: u64| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((s >> 33) % m) as i64
    };
    let ids = (0..8 * SEQ).map(|_| 1 + next(IDS)).collect();
    let labels = (0..8 * SEQ).map(|_| next(LABELS as u64)).collect();
    Rows { ids, labels }
}

/// Step `step` of rank `rank`: its passes, the last of which applies.
/// `panic_in` makes the loss of that micro-batch panic (backward ends early).
fn step(
    replica: &mut Replica<'_, B, Model>,
    rank: usize,
    step: usize,
    panic_in: Option<usize>,
) -> Result<(), TrainError> {
    let device = Default::default();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    for pass in 0..replica.options().backward_passes_per_step {
        let batch = rows(step, pass, rank);
        replica.step(&batch, |model: &Model, micro| {
            assert!(panic_in != Some(micro.index), "micro-batch {} stops (the test's panic)", micro.index);
            let (r, n) = (&micro.rows, micro.rows.len());
            let ids = TensorData::new(micro.batch.ids[r.start * SEQ..r.end * SEQ].to_vec(), [n, SEQ]);
            let ids = Tensor::<B, 2, Int>::from_data(ids, &device);
            let y = TensorData::new(micro.batch.labels[r.start * SEQ..r.end * SEQ].to_vec(), [n * SEQ]);
            let targets = Tensor::<B, 1, Int>::from_data(y, &device);
            loss_fn.forward(model.forward(ids).reshape([n * SEQ, LABELS]), targets)
        })?;
    }
    Ok(())
}

/// The bits of every parameter, end to end.
fn bits(model: &Model) -> Vec<u32> {
    FlatParams::read(model).unwrap().values.concat().iter().map(|x| x.to_bits()).collect()
}

/// A collective whose world is replaced between steps, as an elastic run's
/// is (drove-control's membership client does this through a coordinator).
struct Swap<'a>(RwLock<&'a dyn Collective>);

impl<'a> Swap<'a> {
    fn replace(&self, next: &'a dyn Collective) {
        *self.0.write().unwrap() = next;
    }
}

impl Delegate for Swap<'_> {
    fn place(&self) -> Place {
        let comm = self.0.read().unwrap();
        Place::new(comm.rank(), comm.world_size()).unwrap()
    }
    fn delegate<R>(
        &self,
        _call: Call<'_>,
        run: impl FnOnce(&dyn Collective) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        run(*self.0.read().unwrap())
    }
}

/// The ranks of one world, each taken once by its thread.
struct Seats(std::sync::Mutex<Vec<Option<LocalWorld>>>);

impl Seats {
    fn new(timeout: Duration) -> Seats {
        let ranks = LocalWorld::with_timeout(WORLD, timeout).unwrap().into_iter().map(Some).collect();
        Seats(std::sync::Mutex::new(ranks))
    }
    fn take(&self, rank: usize) -> LocalWorld {
        self.0.lock().unwrap()[rank].take().expect("each rank is taken once")
    }
}

/// How rank [`VICTIM`] is lost in step [`FAILING`].
struct Loss {
    /// The op it is lost at.
    trigger: Trigger,
    /// Whether it hangs up (its peers fail at once) or goes silent (they
    /// fail at their deadline).
    hang_up: bool,
    /// A micro-batch of its failing step whose loss panics.
    panic_in: Option<usize>,
}

/// What one rank saw of a run that lost rank [`VICTIM`] in step [`FAILING`]
/// and redid it in a new world.
struct Seen {
    /// The failing step's error.
    error: TrainError,
    /// The op the fault struck at (on the victim).
    struck: Option<String>,
    /// Parameters and steps applied before the failing step (and after it
    /// failed: the same).
    before: (Vec<u32>, u64),
    /// Parameters after the failing step and the rest were redone.
    redone: Vec<u32>,
}

/// Every rank's parameters after [`STEPS`] steps of `vocab`'s model with
/// `opts`, no rank lost.
fn whole(vocab: usize, opts: &ReplicaOptions) -> Vec<Vec<u32>> {
    let seats = Seats::new(GENEROUS);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                let seats = &seats;
                s.spawn(move || {
                    let comm = seats.take(rank);
                    let mut replica = Replica::new(initial(vocab), &comm, opts.clone(), &Default::default())
                        .expect("a replica");
                    for k in 0..STEPS {
                        step(&mut replica, rank, k, None).expect("no rank is lost");
                    }
                    bits(replica.model())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

/// A run of `vocab`'s model with `opts` that loses rank [`VICTIM`] as `loss`
/// says in step [`FAILING`]; then every rank (the lost one as a process
/// started again) enters a new world, resyncs and redoes that step and the rest.
fn lose(vocab: usize, opts: &ReplicaOptions, loss: &Loss) -> Vec<Seen> {
    let first = Seats::new(if loss.hang_up { GENEROUS } else { DEADLINE });
    let second = Seats::new(GENEROUS);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                let (first, second) = (&first, &second);
                s.spawn(move || {
                    let (gen1, gen2) = (first.take(rank), second.take(rank));
                    let mut faulty = Faulty::new(&gen1, loss.trigger.clone());
                    if loss.hang_up {
                        faulty = faulty.on_strike(|c, _| c.hang_up());
                    }
                    let victim = rank == VICTIM;
                    let first: &dyn Collective = if victim { &faulty } else { &gen1 };
                    let swap = Swap(RwLock::new(first));
                    let device = Default::default();
                    let mut replica = Replica::new(initial(vocab), &swap, opts.clone(), &device).unwrap();
                    for k in 0..FAILING {
                        step(&mut replica, rank, k, None).expect("the steps before the loss");
                    }
                    let before = (bits(replica.model()), replica.steps());
                    let panic_in = loss.panic_in.filter(|_| victim);
                    let error = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        step(&mut replica, rank, FAILING, panic_in)
                    })) {
                        Ok(result) => result.expect_err("the failing step fails"),
                        Err(_) => TrainError::MicroBatchFailed { micro: 0 }, // the test's panic
                    };
                    let failed = (bits(replica.model()), replica.steps());
                    assert_eq!(failed, before, "rank {rank}: the failed step applied nothing: {error}");
                    let struck = faulty.struck();
                    swap.replace(&gen2);
                    replica.resync(&mut []).expect("the new world takes one state");
                    for k in FAILING..STEPS {
                        step(&mut replica, rank, k, None).expect("the steps redone");
                    }
                    Seen { error, struck, before, redone: bits(replica.model()) }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

/// The collective error inside a step's error.
fn comm_error(e: &TrainError) -> &CommError {
    match e {
        TrainError::Comm(c) => c,
        other => panic!("not a collective's error: {other}"),
    }
}

/// Asserts what every rank of `seen` shows: the survivors failed in an op
/// whose label starts with `op` (the very op the victim was lost at, where it
/// was struck), naming the victim, at once if it hung up, at the deadline if
/// it went silent; the redone run equals `reference` bit for bit.
fn assert_lost(what: &str, seen: &[Seen], reference: &[Vec<u32>], op: &str) {
    let struck = seen[VICTIM].struck.clone();
    for (rank, s) in seen.iter().enumerate() {
        let e = &s.error;
        if rank == VICTIM && struck.is_some() {
            assert!(matches!(comm_error(e), CommError::PeerLost { .. }), "{what}: the victim: {e}");
        } else if rank != VICTIM {
            // A rank that hung up is named at once; a silent one at the deadline.
            let (got, ranks) = match (comm_error(e), &struck) {
                (CommError::PeerLost { op, ranks, .. }, Some(_))
                | (CommError::Timeout { op, ranks, .. }, None) => (op, ranks),
                (other, _) => panic!("{what}: rank {rank}: not the lost peer's error: {other}"),
            };
            assert!(got.starts_with(op), "{what}: rank {rank} failed in {got}, not {op}...: {e}");
            if let Some(struck) = &struck {
                assert_eq!(got, struck, "{what}: rank {rank} fails in the op the victim was lost at");
            }
            assert_eq!(ranks, &[VICTIM], "{what}: rank {rank} names the lost rank: {e}");
        }
        assert_eq!(s.before.1, FAILING as u64, "{what}: rank {rank}");
        let differ = s.redone.iter().zip(&reference[rank]).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{what}: rank {rank}: redone, {differ} values differ from the run never lost");
    }
    assert_ne!(reference[0], seen[0].before.0, "{what}: the steps moved the parameters");
}

/// Small buckets (several a step), clipping, 2 micro-batches, `passes` passes.
fn options(placement: Placement, overlap: bool, passes: usize, sparse_rows: SparseRows) -> ReplicaOptions {
    ReplicaOptions {
        lr: 1e-2,
        clip_norm: 1.0,
        micro_batches: 2,
        backward_passes_per_step: passes,
        fusion: FusionOptions { threshold_bytes: 256, ..FusionOptions::default() },
        placement,
        overlap,
        sparse_rows,
        ..ReplicaOptions::default()
    }
}

/// The trigger of the step [`FAILING`]'s `n`th op named `pattern` (every
/// step before it ends with one `step.loss`).
fn in_failing_step(pattern: &str, n: u64) -> Trigger {
    Trigger::named(pattern).nth(n).after(Trigger::named("step.loss").nth(FAILING as u64))
}

#[test]
fn a_rank_lost_while_buckets_are_in_flight_fails_every_rank_in_that_bucket_and_the_redone_step_is_whole() {
    // The second bucket of the overlapped step: the first is averaged on
    // every rank, its values in the engine's hands when the rank is lost.
    let loss = Loss { trigger: in_failing_step("gradients.*", 2), hang_up: true, panic_in: None };
    for placement in [Placement::Host, Placement::Backend] {
        for passes in [1, 2] {
            let what = format!("{placement}, {passes} pass(es)");
            let opts = options(placement, true, passes, SparseRows::off());
            let seen = lose(400, &opts, &loss);
            assert!(
                seen[VICTIM]
                    .struck
                    .as_deref()
                    .is_some_and(|op| op.starts_with("all_reduce \"gradients.bucket")),
                "{what}: struck at {:?}",
                seen[VICTIM].struck
            );
            assert_lost(&what, &seen, &whole(400, &opts), "all_reduce \"gradients.bucket");
        }
    }
}

#[test]
fn a_rank_lost_between_the_row_gathers_is_named_and_the_table_is_not_applied() {
    // The embedding (parameter 0, bucket 0) as rows: its indices gathered,
    // the rank lost before the rows are; overlapped (on the engine) or not.
    let rows = SparseRows { min_bytes: 0, ..SparseRows::default() };
    let loss =
        Loss { trigger: Trigger::named("gradients.bucket0.values").nth(2), hang_up: true, panic_in: None };
    for overlap in [true, false] {
        let what = format!("overlap {overlap}");
        let opts = options(Placement::Host, overlap, 1, rows.clone());
        let seen = lose(400, &opts, &loss);
        assert_eq!(seen[VICTIM].struck.as_deref(), Some("all_gather \"gradients.bucket0.values\""), "{what}");
        assert_lost(&what, &seen, &whole(400, &opts), "all_gather \"gradients.bucket0.values\"");
    }
}

#[test]
fn a_rank_lost_in_the_dense_fallback_of_the_rows_is_named() {
    // A table of 50 rows the two ranks' ~49 rows each outnumber: after the
    // indices' all-gather it goes dense, an all-reduce under the bucket's name.
    let rows = SparseRows { min_bytes: 0, ..SparseRows::default() };
    let loss = Loss { trigger: Trigger::named("gradients.bucket0").nth(2), hang_up: true, panic_in: None };
    for placement in [Placement::Host, Placement::Backend] {
        let what = format!("{placement}");
        let opts = options(placement, true, 1, rows.clone());
        let seen = lose(50, &opts, &loss);
        assert_eq!(seen[VICTIM].struck.as_deref(), Some("all_reduce \"gradients.bucket0\""), "{what}");
        assert_lost(&what, &seen, &whole(50, &opts), "all_reduce \"gradients.bucket0\"");
    }
}

#[test]
fn a_rank_whose_backward_stops_early_is_named_by_the_others_at_their_deadline() {
    // The victim's micro-batch 1 panics before its backward: its engine
    // stops with no bucket whole, and the rank goes silent (it does not hang
    // up), so the others name it when their deadline passes.
    let loss = Loss { trigger: Trigger::named("never"), hang_up: false, panic_in: Some(1) };
    let opts = options(Placement::Host, true, 1, SparseRows::off());
    let seen = lose(400, &opts, &loss);
    assert_lost("a silent rank", &seen, &whole(400, &opts), "all_reduce \"gradients.bucket");
}

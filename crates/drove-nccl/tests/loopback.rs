//! The device communicator's control logic (id exchange, description check,
//! deadline and abort) on CPU: real CPU meshes between thread ranks, and the
//! in-process `Loopback` device in place of NCCL: the same `DeviceComm` code
//! that drives NCCL, with only the device call swapped.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use drove_collective::{Collective, CommError, DType, OpDesc, OpKind, ReduceOp, ReduceOptions};
use drove_comm::{CommOptions, Communicator, FileRendezvous};
use drove_nccl::{DeviceComm, DeviceOptions, DeviceSlice, Error, Loopback, LoopbackWorld};

fn slice(v: &mut [f32]) -> DeviceSlice {
    DeviceSlice { ptr: v.as_mut_ptr() as u64, len: v.len(), dtype: DType::F32 }
}

fn mesh_options(timeout: Duration) -> CommOptions {
    CommOptions { timeout, warn_after: timeout, ..CommOptions::default() }
}

/// Runs `work(rank, mesh, device)` on `n` thread ranks, each with a CPU mesh
/// joined through a directory and its loopback device.
fn world<T: Send + 'static>(
    n: usize,
    mesh_timeout: Duration,
    work: impl Fn(usize, &Communicator, Loopback) -> T + Send + Sync + 'static,
) -> (LoopbackWorld, Vec<T>) {
    let dir = tempfile::tempdir().unwrap();
    let (handle, devices) = LoopbackWorld::new(n);
    let work = std::sync::Arc::new(work);
    let threads: Vec<_> = devices
        .into_iter()
        .enumerate()
        .map(|(rank, device)| {
            let (dir, work) = (dir.path().to_path_buf(), work.clone());
            std::thread::spawn(move || {
                let rv = FileRendezvous::new(&dir, drove_collective::Place::new(rank, n).unwrap());
                let mesh = Communicator::connect(&rv, mesh_options(mesh_timeout)).unwrap();
                work(rank, &mesh, device)
            })
        })
        .collect();
    let out = threads.into_iter().map(|t| t.join().expect("rank thread")).collect();
    (handle, out)
}

#[test]
fn rank_zero_makes_the_id_and_every_rank_joins_with_it() {
    let (handle, out) = world(3, Duration::from_secs(20), |_, mesh, device| {
        DeviceComm::connect(mesh, device, DeviceOptions::default()).map(|c| c.world_size())
    });
    assert!(out.iter().all(|r| matches!(r, Ok(3))), "{out:?}");
    assert_eq!(handle.ids_created(), 1, "only rank 0 creates the id");
    let joined = handle.joined();
    assert!(joined.iter().all(|j| j.is_some() && *j == joined[0]), "{joined:?}");
}

#[test]
fn every_op_gives_the_result_of_its_definition() {
    let (_, out) = world(3, Duration::from_secs(20), |rank, mesh, device| {
        let comm = DeviceComm::connect(mesh, device, DeviceOptions::default()).unwrap();
        let r = rank as f32;
        let mut results = Vec::new();
        for op in [ReduceOp::Sum, ReduceOp::Average, ReduceOp::Min, ReduceOp::Max] {
            let mut v = vec![r + 1.0, 10.0 * r, -r];
            unsafe { comm.all_reduce(mesh, "v", slice(&mut v), ReduceOptions::new(op)).unwrap() };
            results.push(v);
        }
        let mut b = vec![r; 4];
        unsafe { comm.broadcast(mesh, "b", slice(&mut b), 2).unwrap() };
        let mut send = vec![r, r + 0.5];
        let mut gathered = vec![0.0f32; 6];
        unsafe { comm.all_gather(mesh, "g", slice(&mut send), slice(&mut gathered)).unwrap() };
        let mut big: Vec<f32> = (0..6).map(|i| i as f32 * (r + 1.0)).collect();
        let mut part = vec![0.0f32; 2];
        unsafe {
            comm.reduce_scatter(mesh, "rs", slice(&mut big), slice(&mut part), ReduceOptions::sum()).unwrap()
        };
        comm.barrier(mesh, "end").unwrap();
        (results, b, gathered, part)
    });
    for (rank, (results, b, gathered, part)) in out.into_iter().enumerate() {
        assert_eq!(results[0], vec![6.0, 30.0, -3.0], "sum");
        assert_eq!(results[1], vec![2.0, 10.0, -1.0], "average");
        assert_eq!(results[2], vec![1.0, 0.0, -2.0], "min");
        assert_eq!(results[3], vec![3.0, 20.0, 0.0], "max");
        assert_eq!(b, vec![2.0; 4], "broadcast from rank 2");
        assert_eq!(gathered, vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.5], "all_gather in rank order");
        // sum over ranks of i * (r + 1) = 6 i; rank k takes elements 2k and 2k + 1.
        let want: Vec<f32> = (2 * rank..2 * rank + 2).map(|i| 6.0 * i as f32).collect();
        assert_eq!(part, want, "reduce_scatter part of rank {rank}");
    }
}

#[test]
fn a_mismatch_fails_every_rank_with_one_named_error_and_the_next_op_works() {
    let (handle, out) = world(3, Duration::from_secs(20), |rank, mesh, device| {
        let comm = DeviceComm::connect(mesh, device, DeviceOptions::default()).unwrap();
        let mut v = vec![1.0f32; if rank == 1 { 5 } else { 4 }];
        let first = unsafe { comm.all_reduce(mesh, "grad", slice(&mut v), ReduceOptions::sum()) };
        let untouched = v.iter().all(|&x| x == 1.0);
        let mut w = vec![rank as f32; 2];
        let next = unsafe { comm.all_reduce(mesh, "grad", slice(&mut w), ReduceOptions::sum()) };
        (first.map_err(|e| (e.to_string(), e.is_recoverable())), untouched, next.map(|()| w))
    });
    let messages: Vec<String> = out.iter().map(|(f, _, _)| f.clone().unwrap_err().0).collect();
    for (first, untouched, next) in &out {
        let (message, recoverable) = first.clone().unwrap_err();
        assert_eq!(message, messages[0], "every rank gets the same message");
        assert_eq!(
            message,
            "all_reduce \"grad\": ranks disagree on shape: [4] on ranks [0, 2]; [5] on rank 1"
        );
        assert!(recoverable);
        assert!(*untouched, "no data moved");
        assert_eq!(next.as_ref().unwrap(), &vec![3.0, 3.0]);
    }
    assert!(handle.aborted().is_empty(), "a mismatch never touches the device");
}

#[test]
fn a_rank_that_hangs_after_agreeing_is_named_and_the_others_abort_within_the_deadline() {
    let device_deadline = Duration::from_millis(400);
    let mesh_deadline = Duration::from_secs(2);
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let done_tx = std::sync::Mutex::new(done_tx);
    let releaser = std::thread::spawn(move || {
        // Rank 2 stays stuck until ranks 0 and 1 have both returned.
        done_rx.recv().unwrap();
        done_rx.recv().unwrap();
        release_tx.send(()).unwrap();
    });
    let both_done = std::sync::Barrier::new(2);
    let (handle, out) = world(3, mesh_deadline, move |rank, mesh, device| {
        let opts = DeviceOptions { timeout: device_deadline };
        let comm = DeviceComm::connect(mesh, device, opts).unwrap();
        let mut v = vec![1.0f32; 4];
        if rank == 2 {
            // The hung rank: it agrees to the op, then never launches it nor
            // answers the mesh (as a rank stopped inside a kernel would).
            let spec =
                OpDesc::new(OpKind::AllReduce, "grad", DType::F32, &[4]).reducing(ReduceOptions::sum());
            mesh.agree(&spec).unwrap();
            release_rx.lock().unwrap().recv().unwrap();
            return None;
        }
        let started = Instant::now();
        let r = unsafe { comm.all_reduce(mesh, "grad", slice(&mut v), ReduceOptions::sum()) };
        let took = started.elapsed();
        let again = unsafe { comm.all_reduce(mesh, "grad", slice(&mut v), ReduceOptions::sum()) };
        done_tx.lock().unwrap().send(()).unwrap();
        // Neither closes its mesh (by returning) while the other may still
        // wait on it: that would be a lost peer, not the hung one.
        both_done.wait();
        Some((r, took, again))
    });
    releaser.join().unwrap();
    for (rank, result) in out.into_iter().enumerate().take(2) {
        let (r, took, again) = result.unwrap();
        match r {
            Err(Error::Comm(CommError::Timeout { op, ranks, after })) => {
                assert_eq!(op, "all_reduce \"grad\"");
                assert_eq!(ranks, vec![2], "rank {rank} names the rank that did not come");
                assert_eq!(after, device_deadline);
            }
            other => panic!("rank {rank}: expected a timeout naming rank 2, got {other:?}"),
        }
        assert!(took >= device_deadline, "rank {rank} waited {took:?}");
        assert!(took < device_deadline + mesh_deadline + Duration::from_secs(3), "rank {rank} took {took:?}");
        assert!(
            matches!(again, Err(Error::Comm(CommError::Broken { .. }))),
            "an aborted communicator refuses further ops: {again:?}"
        );
    }
    assert_eq!(handle.aborted(), vec![0, 1], "ranks 0 and 1 aborted their device");
}

#[test]
fn bad_arguments_on_one_rank_fail_every_rank_naming_it() {
    let (_, out) = world(2, Duration::from_secs(20), |rank, mesh, device| {
        let comm = DeviceComm::connect(mesh, device, DeviceOptions::default()).unwrap();
        let mut v = vec![1.0f32; 4];
        let opts = if rank == 1 { ReduceOptions::sum().prescale(0.5) } else { ReduceOptions::sum() };
        let scaled = unsafe { comm.all_reduce(mesh, "scaled", slice(&mut v), opts) };
        let root = if rank == 1 { 7 } else { 0 };
        let broadcast = unsafe { comm.broadcast(mesh, "b", slice(&mut v), root) };
        (scaled.unwrap_err().to_string(), broadcast.unwrap_err().to_string())
    });
    for (scaled, broadcast) in out {
        assert!(scaled.contains("rank 1: the device backend takes no scale factors"), "{scaled}");
        // Ranks disagree on the root: a mismatch naming both values.
        assert!(broadcast.contains("root"), "{broadcast}");
    }
}

/// A collective that forwards every op but keeps the trait's default
/// `agree` (an all-gather of the encoded descriptions).
struct Forward<'a>(&'a Communicator);

impl Collective for Forward<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        data: drove_collective::TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        self.0.all_reduce(name, shape, data, opts)
    }
    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        data: drove_collective::TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        self.0.broadcast(name, shape, data, root)
    }
    fn all_gather(
        &self,
        name: &str,
        shape: &[usize],
        data: drove_collective::TensorRef<'_>,
    ) -> Result<drove_collective::Gathered, CommError> {
        self.0.all_gather(name, shape, data)
    }
    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: drove_collective::TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<drove_collective::Gathered, CommError> {
        self.0.reduce_scatter(name, shape, data, opts)
    }
    fn barrier(&self, name: &str) -> Result<(), CommError> {
        self.0.barrier(name)
    }
}

#[test]
fn the_default_agreement_of_any_collective_finds_the_same_mismatch() {
    let (_, out) = world(3, Duration::from_secs(20), |rank, mesh, _| {
        let forward = Forward(mesh);
        let spec = |n: usize| {
            OpDesc::new(OpKind::AllReduce, "grad", DType::F32, &[n]).reducing(ReduceOptions::sum())
        };
        let mismatch = forward.agree(&spec(if rank == 2 { 8 } else { 4 })).map_err(|e| e.to_string());
        let fine = forward.agree(&spec(4)).map_err(|e| e.to_string());
        let cpu = mesh.agree(&spec(if rank == 2 { 8 } else { 4 })).map_err(|e| e.to_string());
        (mismatch, fine, cpu)
    });
    for (mismatch, fine, cpu) in out {
        let message = mismatch.unwrap_err();
        assert!(message.starts_with("all_reduce \"grad\": ranks disagree on shape"), "{message}");
        assert_eq!(Err(message), cpu, "the default and the CPU backend's agreement say the same");
        assert_eq!(fine, Ok(()));
    }
}

/// Joins the CPU mesh of `rank` of `n` through `dir` (one directory per world).
fn mesh_in(dir: &std::path::Path, rank: usize, n: usize) -> Communicator {
    let rv = FileRendezvous::new(dir, drove_collective::Place::new(rank, n).unwrap());
    Communicator::connect(&rv, mesh_options(Duration::from_secs(20))).unwrap()
}

/// Fresh loopback devices by world size, each taken once by rank: a new
/// device for each generation, as `Nccl::new` makes one on the same GPU.
type Pools = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<usize, Vec<Option<Loopback>>>>>;

/// What one rank of the elastic test saw: generation 1's sum, the world of
/// its second `comm_for`, and (for the survivors) the loss and generation 2's sum.
type Seen = (Vec<f32>, usize, Option<String>, Option<Vec<f32>>);

/// Rank `rank` of the elastic test: generation 1 of 3 ranks through `dirs.0`;
/// rank 2 then leaves, and the others go on in generation 2 through `dirs.1`.
fn elastic_rank(rank: usize, pools: Pools, dirs: (std::path::PathBuf, std::path::PathBuf)) -> Seen {
    let make = Box::new(move |place: drove_collective::Place| {
        let mut pools = pools.lock().unwrap();
        Ok(pools.get_mut(&place.world().get()).unwrap()[place.rank().get()].take().unwrap())
    });
    let mut device = drove_nccl::ElasticDevice::new(make, DeviceOptions::default());
    let sum =
        |device: &mut drove_nccl::ElasticDevice<Loopback>, mesh: &Communicator, g: u64, v: &mut [f32]| {
            let comm = device.comm_for(mesh, g)?;
            unsafe { comm.all_reduce(mesh, "g", slice(v), ReduceOptions::sum()) }
        };
    let mesh = mesh_in(&dirs.0, rank, 3);
    let mut v = vec![rank as f32 + 1.0; 2];
    sum(&mut device, &mesh, 1, &mut v).unwrap();
    let same = device.comm_for(&mesh, 1).map(|c| c.world_size()).unwrap();
    if rank == 2 {
        return (v, same, None, None); // gone: its mesh and device dropped
    }
    // The survivors' next op fails naming the lost rank ...
    let lost = sum(&mut device, &mesh, 1, &mut [1.0, 1.0]).unwrap_err();
    drop(mesh);
    // ... and in the next world they reduce again, on a new communicator.
    let mesh = mesh_in(&dirs.1, rank, 2);
    let mut x = vec![rank as f32 + 10.0; 2];
    sum(&mut device, &mesh, 2, &mut x).unwrap();
    assert_eq!(device.generation(), Some(2));
    (v, same, Some(lost.to_string()), Some(x))
}

#[test]
fn an_elastic_world_re_forms_its_device_communicator_without_the_lost_rank() {
    let (first, first_devices) = LoopbackWorld::new(3);
    let (second, second_devices) = LoopbackWorld::new(2);
    let pools: Pools = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::from([
        (3, first_devices.into_iter().map(Some).collect()),
        (2, second_devices.into_iter().map(Some).collect()),
    ])));
    let dir = tempfile::tempdir().unwrap();
    let dirs = (dir.path().join("generation-1"), dir.path().join("generation-2"));
    std::fs::create_dir_all(&dirs.0).unwrap();
    std::fs::create_dir_all(&dirs.1).unwrap();
    let threads: Vec<_> = (0..3)
        .map(|rank| {
            let (pools, dirs) = (pools.clone(), dirs.clone());
            std::thread::spawn(move || elastic_rank(rank, pools, dirs))
        })
        .collect();
    let out: Vec<_> = threads.into_iter().map(|t| t.join().expect("rank thread")).collect();
    for (rank, (v, same, lost, x)) in out.into_iter().enumerate() {
        assert_eq!((v, same), (vec![6.0, 6.0], 3), "generation 1 on rank {rank}");
        if rank < 2 {
            let lost = lost.unwrap();
            // Rank 2 among the lost: a survivor that failed first and dropped
            // its mesh may be named beside it ("lost rank(s) [0, 2]").
            let named: Vec<&str> = lost
                .split_once("lost rank(s) [")
                .and_then(|(_, rest)| rest.split_once(']'))
                .map_or_else(Vec::new, |(list, _)| list.split(", ").collect());
            assert!(
                lost.contains("rank 2") || named.contains(&"2"),
                "rank {rank} names the lost rank: {lost}"
            );
            assert_eq!(x.unwrap(), vec![21.0, 21.0], "generation 2 on rank {rank}");
        }
    }
    assert_eq!(first.ids_created(), 1, "generation 1 made its id once, not again on the second comm_for");
    assert_eq!(first.aborted(), vec![0, 1], "the survivors aborted generation 1's communicator");
    assert_eq!(second.ids_created(), 1, "generation 2's rank 0 made a new id");
    let (old, new) = (first.joined()[0].unwrap(), second.joined());
    assert!(new.iter().all(|j| *j == new[0] && j.is_some_and(|j| j != old)), "{new:?} after {old:?}");
}

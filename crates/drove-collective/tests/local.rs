//! `LocalWorld` as any transport behaves: results, agreement, deadlines; and
//! `Delegate` forwarding every op.

use std::sync::RwLock;
use std::time::Duration;

use drove_collective::transport::{Call, CallMode, Delegate};
use drove_collective::{
    Collective, CommError, DType, Element, LocalWorld, OpDesc, OpKind, Place, ReduceOptions,
};

/// Runs `work` on every rank of `ranks`, each on its own thread.
fn on_each<C: Collective, T: Send>(ranks: &[C], work: impl Fn(&C) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks.iter().map(|c| s.spawn(|| work(c))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_op_gives_what_a_transport_gives() {
    let ranks = LocalWorld::new(3).unwrap();
    let out = on_each(&ranks, |c| {
        let r = c.rank() as f32;
        let mut avg = vec![r; 5];
        c.all_reduce("avg", &[5], f32::tensor_mut(&mut avg), ReduceOptions::average().postscale(2.0))
            .unwrap();
        let mut b = vec![r; 2];
        c.broadcast("b", &[2], f32::tensor_mut(&mut b), 2).unwrap();
        let rows = c.rank() + 1;
        let g = c.all_gather("g", &[rows, 1], i64::tensor_ref(&vec![c.rank() as i64; rows])).unwrap();
        let s = c.reduce_scatter("s", &[4, 2], f32::tensor_ref(&[1.0; 8]), ReduceOptions::sum()).unwrap();
        c.barrier("end").unwrap();
        (
            avg[0],
            b,
            i64::from_buffer(g.data).unwrap(),
            g.first_dims,
            s.shape,
            f32::from_buffer(s.data).unwrap(),
        )
    });
    for (rank, (avg, b, gathered, first_dims, shape, scattered)) in out.into_iter().enumerate() {
        assert_eq!(avg, 2.0, "mean of 0, 1, 2 times 2");
        assert_eq!(b, [2.0, 2.0]);
        assert_eq!(gathered, [0, 1, 1, 2, 2, 2]);
        assert_eq!(first_dims, [1, 2, 3]);
        // 4 rows over 3 ranks: 2, 1, 1.
        assert_eq!(shape, [if rank == 0 { 2 } else { 1 }, 2]);
        assert!(scattered.iter().all(|&x| x == 3.0), "{scattered:?}");
    }
}

#[test]
fn a_mismatch_fails_every_rank_alike_and_the_world_goes_on() {
    let ranks = LocalWorld::new(3).unwrap();
    let out = on_each(&ranks, |c| {
        let n = if c.rank() == 1 { 8 } else { 4 };
        let mut x = vec![1.0f32; n];
        let err = c.all_reduce("grad", &[n], f32::tensor_mut(&mut x), ReduceOptions::sum()).unwrap_err();
        let mut y = [1.0f32; 4];
        c.all_reduce("next", &[4], f32::tensor_mut(&mut y), ReduceOptions::sum()).unwrap();
        (err.to_string(), y[0])
    });
    for (err, next) in out {
        assert_eq!(err, "all_reduce \"grad\": ranks disagree on shape: [4] on ranks [0, 2]; [8] on rank 1");
        assert_eq!(next, 3.0);
    }
}

#[test]
fn a_rank_that_never_comes_is_named_at_the_deadline() {
    let mut ranks = LocalWorld::with_timeout(2, Duration::from_millis(200)).unwrap();
    let absent = ranks.pop().unwrap();
    let err = ranks[0].barrier("lonely").unwrap_err();
    match err {
        CommError::Timeout { ranks, .. } => assert_eq!(ranks, [1]),
        other => panic!("expected a timeout naming rank 1, got {other}"),
    }
    assert!(matches!(absent.barrier("late"), Err(CommError::Broken { .. })), "the world is broken for all");
}

#[test]
fn agree_checks_descriptions_alone() {
    let ranks = LocalWorld::new(2).unwrap();
    let out = on_each(&ranks, |c| {
        let root = c.rank();
        c.agree(&OpDesc::new(OpKind::Broadcast, "w", DType::F32, &[3]).from_root(root))
            .map_err(|e| e.to_string())
    });
    for r in out {
        assert!(r.unwrap_err().contains("ranks disagree on root: root 0 on rank 0; root 1 on rank 1"));
    }
}

/// A collective whose communicator can be swapped, forwarding through `Delegate`.
struct Swap {
    inner: RwLock<Option<LocalWorld>>,
    calls: std::sync::Mutex<Vec<(String, CallMode)>>,
}

impl Delegate for Swap {
    fn place(&self) -> Place {
        let inner = self.inner.read().unwrap();
        let c = inner.as_ref().expect("a world");
        Place::new(c.rank(), c.world_size()).unwrap()
    }

    fn delegate<R>(
        &self,
        call: Call<'_>,
        run: impl FnOnce(&dyn Collective) -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        self.calls.lock().unwrap().push((call.span_name(), call.mode));
        match self.inner.read().unwrap().as_ref() {
            Some(c) => run(c),
            None => Err(CommError::Broken { cause: "between worlds".into() }),
        }
    }
}

#[test]
fn a_delegate_forwards_every_op_including_async_ones() {
    let swaps: Vec<Swap> = LocalWorld::new(2)
        .unwrap()
        .into_iter()
        .map(|c| Swap { inner: RwLock::new(Some(c)), calls: Default::default() })
        .collect();
    let out = on_each(&swaps, |s| {
        let mut x = [1.0f32; 3];
        s.all_reduce("a", &[3], f32::tensor_mut(&mut x), ReduceOptions::sum()).unwrap();
        let pending = s.all_reduce_async("b", &[3], f32::buffer(vec![2.0; 3]), ReduceOptions::sum());
        let y = f32::from_buffer(pending.wait().unwrap()).unwrap();
        s.barrier("c").unwrap();
        let rank = s.rank();
        let taken = s.inner.write().unwrap().take();
        let between = s.barrier("d").unwrap_err().to_string();
        drop(taken);
        (x[0], y[0], rank, between)
    });
    assert!(out.iter().all(|(x, y, _, e)| *x == 2.0 && *y == 4.0 && e.contains("between worlds")));
    let calls = swaps[0].calls.lock().unwrap().clone();
    let named: Vec<(&str, CallMode)> = calls.iter().map(|(n, m)| (n.as_str(), *m)).collect();
    assert_eq!(
        named,
        [
            ("all_reduce a", CallMode::Blocking),
            ("all_reduce b", CallMode::Started),
            ("barrier c", CallMode::Blocking),
            ("barrier d", CallMode::Blocking)
        ]
    );
}

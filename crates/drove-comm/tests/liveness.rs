//! Past an op's deadline a communicator asks its `Liveness` about the peers
//! it still waits for: a live one is waited for (up to the hang limit), a
//! silent one is lost. Two ranks as threads; the late rank is held back by
//! a channel until the other has passed its deadline, never by a sleep.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drove_collective::{Collective, CommError, Element, Place, ReduceOptions};
use drove_comm::{CommOptions, Communicator, FileRendezvous, Liveness, Transport};

/// Names `silent` silent, and tells `asked` each time it is asked.
#[derive(Debug)]
struct Stub {
    silent: Vec<usize>,
    asked: Mutex<Sender<Vec<usize>>>,
}

impl Liveness for Stub {
    fn silent(&self, ranks: &[usize]) -> Vec<usize> {
        let _ = self.asked.lock().unwrap().send(ranks.to_vec());
        ranks.iter().copied().filter(|r| self.silent.contains(r)).collect()
    }
}

/// Rank 0 (with the stub, a 0.2 s deadline and `hang_limit`) and rank 1
/// all-reduce once; rank 1 starts only when `release` says so, given what
/// rank 0's stub was asked and rank 0's result if it has one.
fn two_ranks(
    transport: Transport,
    silent: Vec<usize>,
    hang_limit: Duration,
    release: impl FnOnce(&Receiver<Vec<usize>>, &Receiver<Result<f32, CommError>>) + Send + 'static,
) -> (Result<f32, CommError>, Result<f32, CommError>) {
    let dir = tempfile::tempdir().unwrap();
    let (asked_tx, asked) = channel();
    let (done_tx, done) = channel();
    let opts = CommOptions { transport, connect_timeout: Duration::from_secs(60), ..CommOptions::default() };
    let first = {
        let path = dir.path().to_path_buf();
        let opts = CommOptions {
            timeout: Duration::from_millis(200),
            warn_after: Duration::from_millis(100),
            hang_limit,
            liveness: Some(Arc::new(Stub { silent, asked: Mutex::new(asked_tx) })),
            ..opts.clone()
        };
        std::thread::spawn(move || {
            let comm = Communicator::connect(&FileRendezvous::new(&path, Place::new(0, 2).unwrap()), opts)?;
            // Rank 1 is connected too: only the all-reduce waits for it.
            let mut x = [1.0f32; 1024];
            let result = comm.all_reduce("late", &[1024], f32::tensor_mut(&mut x), ReduceOptions::sum());
            let result = result.map(|()| x[1023]);
            let _ = done_tx
                .send(result.as_ref().copied().map_err(|e| CommError::Broken { cause: e.to_string() }));
            result
        })
    };
    let path = dir.path().to_path_buf();
    let second = std::thread::spawn(move || {
        let comm = Communicator::connect(&FileRendezvous::new(&path, Place::new(1, 2).unwrap()), opts)?;
        release(&asked, &done);
        let mut x = [2.0f32; 1024];
        comm.all_reduce("late", &[1024], f32::tensor_mut(&mut x), ReduceOptions::sum()).map(|()| x[0])
    });
    (first.join().unwrap(), second.join().unwrap())
}

#[test]
fn a_peer_alive_past_the_deadline_is_waited_for() {
    for transport in [Transport::Tcp, Transport::Auto] {
        // Rank 1 comes once rank 0, past its deadline, has asked about it.
        let (a, b) = two_ranks(transport, vec![], Duration::from_secs(600), |asked, _| {
            assert_eq!(asked.recv().unwrap(), [1], "rank 0 asks about the rank it waits for");
        });
        assert_eq!(a.unwrap(), 3.0, "{transport:?}: rank 0 waited for the live rank 1");
        assert_eq!(b.unwrap(), 3.0, "{transport:?}");
    }
}

#[test]
fn a_silent_peer_is_lost_at_the_deadline() {
    for transport in [Transport::Tcp, Transport::Auto] {
        // Rank 1 comes only after rank 0 has given up on it.
        let (a, _) = two_ranks(transport, vec![1], Duration::from_secs(600), |_, done| {
            let _ = done.recv();
        });
        match a {
            Err(CommError::Timeout { ranks, .. }) => assert_eq!(ranks, [1], "{transport:?}"),
            other => panic!("{transport:?}: rank 0 should time out naming rank 1, got {other:?}"),
        }
    }
}

#[test]
fn a_live_peer_that_never_comes_is_hung_at_the_hang_limit() {
    for transport in [Transport::Tcp, Transport::Auto] {
        let (a, _) = two_ranks(transport, vec![], Duration::from_millis(600), |_, done| {
            let _ = done.recv();
        });
        match a {
            Err(e @ CommError::Hung { .. }) => {
                let CommError::Hung { ref ranks, after, .. } = e else { unreachable!() };
                assert_eq!(ranks, &[1], "{transport:?}");
                assert_eq!(after, Duration::from_millis(600));
                assert!(e.is_membership_loss(), "a hung peer re-forms an elastic world");
                assert!(e.to_string().contains("hang limit"), "{e}");
            }
            other => panic!("{transport:?}: rank 0 should give up at the hang limit, got {other:?}"),
        }
    }
}

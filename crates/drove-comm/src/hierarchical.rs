//! The hierarchical all-reduce (Horovod's `HOROVOD_HIERARCHICAL_ALLREDUCE`,
//! NCCL's tree across nodes): when some ranks share a host and others do not,
//! each host reduces its ranks' tensors into its leader (its lowest rank) over
//! shared memory, the leaders run the TCP ring among themselves, and each
//! leader copies the result to its host's ranks over shared memory. Only one
//! rank per host touches the network, and it sends the host's sum once
//! instead of every rank sending its own.
//!
//! Every rank ends with the leaders' ring result, so all ranks agree bit for
//! bit; against the flat ring, integer results are equal and floating-point
//! ones differ only by the order of the additions (see the README).
//!
//! A leader that fails in the ring (a host cut off, a rank lost) records its
//! error in its host's region, and the ranks waiting for it there fail at once
//! with the same ranks named. They wait for it [`LEADER_GRACE`] past the
//! op's deadline: the leader gives up on the network at the deadline, and its
//! error, naming the ranks between hosts, is the one to report; a leader
//! that is itself stuck is named when the grace has passed too.

use std::time::Duration;

use crate::clock::Clock;
use crate::reduction::Reduction;
use crate::ring::{Ring, RingRun};
use crate::shm::Shm;
use crate::staged::{Deliver, Staged};
use drove_collective::CommError;
use drove_collective::transport::reduce::finish;

/// How long past the op's deadline a rank waits for its host's leader.
pub(crate) const LEADER_GRACE: Duration = Duration::from_secs(2);

/// This rank's host in a hierarchical world.
pub(crate) struct HostGroup {
    /// The host's region (none when this rank is alone on its host).
    shm: Option<Shm>,
    /// The leaders of every host (their lowest ranks), in host order.
    leaders: Vec<usize>,
    /// The host's ranks, this one among them, in rank order.
    ranks: Vec<usize>,
}

impl HostGroup {
    /// `ranks` (this host's, in order; the first leads) sharing `shm`, among
    /// the hosts led by `leaders`.
    pub fn new(shm: Option<Shm>, ranks: Vec<usize>, leaders: Vec<usize>) -> HostGroup {
        assert!(ranks.len() < 2 || shm.is_some(), "a host of several ranks shares a region");
        HostGroup { shm, leaders, ranks }
    }

    fn leader(&self) -> usize {
        self.ranks[0]
    }
}

/// All-reduce in three steps: to this host's leader over shared memory,
/// among the leaders over the ring, back to this host's ranks.
pub(crate) fn all_reduce(
    group: &mut HostGroup,
    round: &mut usize,
    run: &mut RingRun<'_>,
    buf: &mut [u8],
    red: Reduction,
    clock: &mut Clock,
) -> Result<(), CommError> {
    let (rank, world) = (run.mesh.rank, run.mesh.world);
    let leader = group.leader();
    if let Some(shm) = group.shm.as_mut() {
        let mut staged = Staged { shm, round: &mut *round, mesh: &*run.mesh, fault: &mut *run.fault };
        staged.reduce(buf, red, Deliver::Slot(0), None, clock)?;
    }
    if rank == leader {
        let between = if group.leaders.len() > 1 {
            let ring = Ring::of(group.leaders.clone(), rank);
            run.all_reduce(&ring, buf, red, world, clock)
        } else {
            finish(red.dtype, red.op, world, red.postscale, buf);
            Ok(())
        };
        if let Err(e) = between {
            if let Some(shm) = group.shm.as_ref() {
                shm.abort(&e);
            }
            return Err(e);
        }
    }
    if let Some(shm) = group.shm.as_mut() {
        let mut waiting = if rank == leader { clock.clone() } else { clock.with_grace(LEADER_GRACE) };
        let mut staged = Staged { shm, round: &mut *round, mesh: &*run.mesh, fault: &mut *run.fault };
        staged.broadcast(buf, 0, &mut waiting)?;
    }
    Ok(())
}

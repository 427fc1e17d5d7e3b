//! [`Loopback`]: an in-process stand-in for NCCL whose "device memory" is host
//! memory, for running [`DeviceComm`](crate::DeviceComm)'s control logic (and
//! code built on it) on machines without a GPU. Ranks are threads of one
//! process; an op completes when every rank has launched it, as NCCL's does,
//! and never completes while one rank has not: exactly what a hung peer does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use drove_collective::{DType, ReduceOp, bf16, f16};

use crate::device::{Device, DeviceCall, GpuLibraryError, UniqueId};

/// One op in flight: each rank's launched call and input bytes, and how many
/// ranks have taken their result.
type Slots = (Vec<Option<(DeviceCall, Vec<u8>)>>, usize);

#[derive(Default)]
struct State {
    ids_created: usize,
    joined: Vec<Option<UniqueId>>,
    aborted: Vec<bool>,
    /// Per op sequence number.
    ops: HashMap<u64, Slots>,
}

/// The shared world of [`Loopback`] devices, and what a test can ask of it.
#[derive(Clone)]
pub struct LoopbackWorld {
    size: usize,
    state: Arc<Mutex<State>>,
}

impl LoopbackWorld {
    /// A world of `size` ranks and one device per rank, in rank order.
    pub fn new(size: usize) -> (LoopbackWorld, Vec<Loopback>) {
        let state = State { joined: vec![None; size], aborted: vec![false; size], ..State::default() };
        let world = LoopbackWorld { size, state: Arc::new(Mutex::new(state)) };
        let devices = (0..size)
            .map(|slot| Loopback { world: world.clone(), slot, rank: None, seq: 0, pending: InFlight::Idle })
            .collect();
        (world, devices)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many unique ids were created (rank 0 makes exactly one per communicator).
    pub fn ids_created(&self) -> usize {
        self.lock().ids_created
    }

    /// The id each rank joined with (`None`: it has not joined).
    pub fn joined(&self) -> Vec<Option<UniqueId>> {
        self.lock().joined.clone()
    }

    /// Which ranks' devices were aborted.
    pub fn aborted(&self) -> Vec<usize> {
        self.lock().aborted.iter().enumerate().filter(|(_, a)| **a).map(|(r, _)| r).collect()
    }
}

enum InFlight {
    Idle,
    Init(UniqueId),
    Op(u64, DeviceCall),
}

/// One rank's stand-in device. Addresses in its [`DeviceCall`]s are host addresses.
pub struct Loopback {
    world: LoopbackWorld,
    slot: usize,
    rank: Option<usize>,
    seq: u64,
    pending: InFlight,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Device for Loopback {
    fn unique_id(&mut self) -> Result<UniqueId, GpuLibraryError> {
        self.world.lock().ids_created += 1;
        let mut id = [0u8; 128];
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        id[..8].copy_from_slice(&n.to_le_bytes());
        id[8..16].copy_from_slice(&(std::process::id() as u64).to_le_bytes());
        Ok(UniqueId(id))
    }

    fn init(&mut self, id: &UniqueId, world: usize, rank: usize) -> Result<(), GpuLibraryError> {
        if world != self.world.size || rank >= world {
            return Err(GpuLibraryError::call(
                "loopback init",
                format!("rank {rank} of {world} in a loopback world of {}", self.world.size),
            ));
        }
        self.world.lock().joined[rank] = Some(*id);
        self.rank = Some(rank);
        self.pending = InFlight::Init(*id);
        Ok(())
    }

    unsafe fn launch(&mut self, call: &DeviceCall) -> Result<(), GpuLibraryError> {
        let rank = self.rank.ok_or_else(|| GpuLibraryError::call("loopback launch", "not joined"))?;
        let mut state = self.world.lock();
        if state.aborted[self.slot] {
            return Err(GpuLibraryError::call("loopback launch", "the communicator was aborted"));
        }
        // SAFETY: the caller's contract: the input is valid for its count.
        let input = unsafe { input_bytes(call, self.world.size) };
        let seq = self.seq;
        self.seq += 1;
        let (slots, _) = state.ops.entry(seq).or_insert_with(|| (vec![None; self.world.size], 0));
        slots[rank] = Some((*call, input));
        self.pending = InFlight::Op(seq, *call);
        Ok(())
    }

    fn poll(&mut self) -> Result<bool, GpuLibraryError> {
        let rank = self.rank.unwrap_or(self.slot);
        let mut state = self.world.lock();
        if state.aborted[self.slot] {
            return Err(GpuLibraryError::call("loopback poll", "the communicator was aborted"));
        }
        match &self.pending {
            InFlight::Idle => Ok(true),
            InFlight::Init(id) => {
                if state.joined.iter().any(|j| j.is_some_and(|j| j != *id)) {
                    return Err(GpuLibraryError::call(
                        "loopback init",
                        "ranks joined with different unique ids",
                    ));
                }
                Ok(state.joined.iter().all(Option::is_some))
            }
            InFlight::Op(seq, call) => {
                let (seq, call) = (*seq, *call);
                let Some((slots, _)) = state.ops.get(&seq) else { return Ok(true) };
                if slots.iter().any(Option::is_none) {
                    return Ok(false);
                }
                if let Some(r) =
                    slots.iter().position(|s| s.as_ref().is_some_and(|(c, _)| !same_op(c, &call)))
                {
                    return Err(GpuLibraryError::call(
                        "loopback op",
                        format!("rank {r} launched a different op as op #{seq}: {:?}", slots[r]),
                    ));
                }
                let inputs: Vec<&[u8]> =
                    slots.iter().map(|s| s.as_ref().map_or(&[][..], |(_, b)| b)).collect();
                // SAFETY: the caller's contract: the output is valid for its count.
                unsafe { complete(&call, rank, &inputs) };
                self.pending = InFlight::Idle;
                let size = self.world.size;
                if let Some((_, done)) = state.ops.get_mut(&seq) {
                    *done += 1;
                    if *done == size {
                        state.ops.remove(&seq);
                    }
                }
                Ok(true)
            }
        }
    }

    fn abort(&mut self) {
        self.world.lock().aborted[self.slot] = true;
        self.pending = InFlight::Idle;
    }

    fn describe(&self) -> String {
        format!("loopback device {} of {}", self.slot, self.world.size)
    }
}

/// Calls agree when everything but the addresses agrees.
fn same_op(a: &DeviceCall, b: &DeviceCall) -> bool {
    use DeviceCall::*;
    match (a, b) {
        (AllReduce { count, dtype, op, .. }, AllReduce { count: c, dtype: d, op: o, .. }) => {
            count == c && dtype == d && op == o
        }
        (Broadcast { count, dtype, root, .. }, Broadcast { count: c, dtype: d, root: r, .. }) => {
            count == c && dtype == d && root == r
        }
        (AllGather { count, dtype, .. }, AllGather { count: c, dtype: d, .. }) => count == c && dtype == d,
        (ReduceScatter { count, dtype, op, .. }, ReduceScatter { count: c, dtype: d, op: o, .. }) => {
            count == c && dtype == d && op == o
        }
        (Barrier, Barrier) => true,
        _ => false,
    }
}

unsafe fn input_bytes(call: &DeviceCall, world: usize) -> Vec<u8> {
    let (ptr, n, dtype) = match *call {
        DeviceCall::AllReduce { send, count, dtype, .. }
        | DeviceCall::Broadcast { send, count, dtype, .. } => (send, count, dtype),
        DeviceCall::AllGather { send, count, dtype, .. } => (send, count, dtype),
        DeviceCall::ReduceScatter { send, count, dtype, .. } => (send, count * world, dtype),
        DeviceCall::Barrier => return Vec::new(),
    };
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, n * dtype.size()) }.to_vec()
}

unsafe fn complete(call: &DeviceCall, rank: usize, inputs: &[&[u8]]) {
    let write = |ptr: u64, bytes: &[u8]| {
        // SAFETY: the caller's contract on the output address.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len()) }
    };
    match *call {
        DeviceCall::AllReduce { recv, dtype, op, .. } => write(recv, &reduce(dtype, op, inputs)),
        DeviceCall::Broadcast { recv, root, .. } => write(recv, inputs[root]),
        DeviceCall::AllGather { recv, .. } => write(recv, &inputs.concat()),
        DeviceCall::ReduceScatter { recv, count, dtype, op, .. } => {
            let all = reduce(dtype, op, inputs);
            let part = count * dtype.size();
            write(recv, &all[rank * part..(rank + 1) * part]);
        }
        DeviceCall::Barrier => {}
    }
}

/// Elementwise reduction through f64 (exact for f16, bf16, f32 and integers
/// below 2^53; a stand-in, not a numerics reference).
fn reduce(dtype: DType, op: ReduceOp, inputs: &[&[u8]]) -> Vec<u8> {
    let values: Vec<Vec<f64>> = inputs.iter().map(|b| decode(dtype, b)).collect();
    let n = values[0].len();
    let world = values.len() as f64;
    let out: Vec<f64> = (0..n)
        .map(|i| {
            let column = values.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => column.sum(),
                ReduceOp::Average if dtype.is_float() => column.sum::<f64>() / world,
                ReduceOp::Average => (column.sum::<f64>() / world).trunc(),
                ReduceOp::Min => column.fold(f64::INFINITY, f64::min),
                ReduceOp::Max => column.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Product => column.product(),
            }
        })
        .collect();
    encode(dtype, &out)
}

fn decode(dtype: DType, b: &[u8]) -> Vec<f64> {
    let chunks = |n: usize| b.chunks_exact(n);
    match dtype {
        DType::F32 => chunks(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) as f64).collect(),
        DType::F64 => chunks(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect(),
        DType::F16 => chunks(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::BF16 => chunks(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
        DType::I32 => chunks(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as f64).collect(),
        DType::I64 => chunks(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as f64).collect(),
    }
}

fn encode(dtype: DType, v: &[f64]) -> Vec<u8> {
    match dtype {
        DType::F32 => v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
        DType::F64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F16 => v.iter().flat_map(|x| f16::from_f64(*x).to_le_bytes()).collect(),
        DType::BF16 => v.iter().flat_map(|x| bf16::from_f64(*x).to_le_bytes()).collect(),
        DType::I32 => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        DType::I64 => v.iter().flat_map(|x| (*x as i64).to_le_bytes()).collect(),
    }
}

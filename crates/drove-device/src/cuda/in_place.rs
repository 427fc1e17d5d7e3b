//! [`check_in_place`]: the GPU check's proof that [`NcclBuckets`] and
//! [`device_memory`] reduce, read and write the bytes they should.
//!
//! A bucket all-reduce at world size 1 changes nothing, so on its own it
//! cannot tell a right address from a wrong one. The check therefore also
//! gathers from a case's tensor into a fresh one and from a fresh one into the
//! case's tensor (NCCL's all-gather: at world 1 a device-to-device copy), reads
//! both back through burn, and compares them bit for bit with what they must
//! hold; the tensors a case shares its buffer with are read too, and must be
//! as they were. Each case is a tensor that takes one branch of
//! [`device_memory`]: its own buffer, a buffer shared with a clone or with the
//! other pieces of a `split`, a view at an offset into a buffer, and a
//! broadcast (stride 0) layout.
//!
//! Every rank runs the same ops in the same order, so the check runs at any
//! world size (two ranks on one GPU included); values are multiples of 1/4
//! below 256, so sums are exact and the average is bit for bit at world sizes
//! that are powers of two (within 1e-6 relative otherwise).

use burn::tensor::{Tensor, TensorData};
use drove_collective::{Collective, ReduceOptions};
use serde::Serialize;

use super::{Access, Cuda, CudaDevice, NcclBuckets, device_memory};

/// Elements of each case's tensor: 4096 f32s (16 KiB), a multiple of the
/// 512-byte alignment at which burn slices a CUDA tensor without a copy.
const LEN: usize = 4096;

/// One tensor layout the check runs the ops on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseKind {
    /// A tensor made from host data: its own buffer, from its first byte.
    Fresh,
    /// A clone of a tensor that stays alive: one buffer, two tensors.
    SharedClone,
    /// The middle third of a tensor sliced without a copy (a view 16 KiB into
    /// the buffer), whose parent is gone: it alone holds the buffer.
    OffsetSlice,
    /// The middle piece of a `split` into three, the other two alive.
    SplitPiece,
    /// One value broadcast to the whole length by `expand` (stride 0).
    Expanded,
}

impl CaseKind {
    const ALL: [CaseKind; 5] = [
        CaseKind::Fresh,
        CaseKind::SharedClone,
        CaseKind::OffsetSlice,
        CaseKind::SplitPiece,
        CaseKind::Expanded,
    ];

    /// The branch of [`device_memory`] the case exists for, and the byte
    /// offset its view starts at.
    fn expected(self) -> (Access, u64) {
        match self {
            CaseKind::Fresh => (Access::InPlace, 0),
            CaseKind::SharedClone => (Access::CopiedShared, 0),
            CaseKind::OffsetSlice => (Access::InPlace, (LEN * 4) as u64),
            CaseKind::SplitPiece => (Access::CopiedShared, 0),
            CaseKind::Expanded => (Access::CopiedStrided, 0),
        }
    }

    /// The values the case's tensor holds on `rank` for instance `salt`.
    fn values(self, rank: usize, salt: usize) -> Vec<f32> {
        match self {
            CaseKind::Expanded => vec![value(rank, salt, 0); LEN],
            CaseKind::OffsetSlice | CaseKind::SplitPiece => parent(rank, salt)[LEN..2 * LEN].to_vec(),
            CaseKind::Fresh | CaseKind::SharedClone => (0..LEN).map(|i| value(rank, salt, i)).collect(),
        }
    }

    /// The case's tensor, with the tensors that share its buffer and what
    /// they hold.
    fn build(self, rank: usize, salt: usize, device: &CudaDevice) -> Built {
        let upload = |v: Vec<f32>| {
            let n = v.len();
            Tensor::<Cuda, 1>::from_data(TensorData::new(v, [n]), device)
        };
        match self {
            CaseKind::Fresh => Built { tensor: upload(self.values(rank, salt)), sharers: Vec::new() },
            CaseKind::SharedClone => {
                let values = self.values(rank, salt);
                let original = upload(values.clone());
                Built { tensor: original.clone(), sharers: vec![(original, values)] }
            }
            CaseKind::OffsetSlice => {
                Built { tensor: upload(parent(rank, salt)).slice(LEN..2 * LEN), sharers: Vec::new() }
            }
            CaseKind::SplitPiece => {
                let values = parent(rank, salt);
                let mut pieces = upload(values.clone()).split_with_sizes(vec![LEN; 3], 0).into_iter();
                let (first, middle, last) = (pieces.next(), pieces.next(), pieces.next());
                let (Some(first), Some(middle), Some(last)) = (first, middle, last) else {
                    unreachable!("a split into three sizes gives three pieces")
                };
                Built {
                    tensor: middle,
                    sharers: vec![(first, values[..LEN].to_vec()), (last, values[2 * LEN..].to_vec())],
                }
            }
            CaseKind::Expanded => {
                let one = upload(vec![value(rank, salt, 0)]);
                Built { tensor: one.expand([LEN]), sharers: Vec::new() }
            }
        }
    }
}

/// A case's tensor and the tensors sharing its buffer, each with its values.
struct Built {
    tensor: Tensor<Cuda, 1>,
    sharers: Vec<(Tensor<Cuda, 1>, Vec<f32>)>,
}

/// A rank's value at `i` for instance `salt`: a multiple of 1/4 in
/// [-100, 155], different on each rank.
fn value(rank: usize, salt: usize, i: usize) -> f32 {
    ((i * 7 + salt * 131 + rank * 13) % 1021) as f32 * 0.25 - 100.0
}

/// The three-piece parent of the slice cases.
fn parent(rank: usize, salt: usize) -> Vec<f32> {
    (0..3 * LEN).map(|i| value(rank, salt, i)).collect()
}

/// One check of one case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseCheck {
    /// What was checked (`built`, `device_memory`, `all_reduce`,
    /// `all_gather_from`, `all_gather_into`).
    pub check: &'static str,
    /// Whether it held.
    pub passed: bool,
    /// What was compared, or where it first differed, or the error.
    pub detail: String,
}

/// The checks of one case.
#[derive(Clone, Debug, Serialize)]
pub struct InPlaceCase {
    /// The layout.
    pub case: CaseKind,
    /// How [`device_memory`] reached it.
    pub access: Option<Access>,
    /// Byte offset of the case's tensor into its buffer.
    pub offset_bytes: Option<u64>,
    /// Whether every check held.
    pub passed: bool,
    /// The checks, in the order run.
    pub checks: Vec<CaseCheck>,
}

/// What [`check_in_place`] found on this rank.
#[derive(Clone, Debug, Serialize)]
pub struct InPlaceReport {
    /// This rank.
    pub rank: usize,
    /// Ranks in the communicator.
    pub world_size: usize,
    /// What NCCL runs on.
    pub nccl: String,
    /// Elements of each case's tensor.
    pub elements: usize,
    /// Whether every check of every case held.
    pub passed: bool,
    /// One entry per case.
    pub cases: Vec<InPlaceCase>,
}

/// Runs every case through [`device_memory`], [`NcclBuckets`]' all-reduce
/// and its all-gather in both directions on every rank of `mesh`, reading
/// every result back through burn. Failures (a wrong value, an NCCL error)
/// are recorded, not returned: the report says what held and what did not.
pub fn check_in_place(buckets: &NcclBuckets, mesh: &dyn Collective) -> InPlaceReport {
    let cases: Vec<InPlaceCase> = CaseKind::ALL.iter().map(|&kind| run_case(buckets, mesh, kind)).collect();
    InPlaceReport {
        rank: mesh.rank(),
        world_size: mesh.world_size(),
        nccl: buckets.describe(),
        elements: LEN,
        passed: cases.iter().all(|c| c.passed),
        cases,
    }
}

fn run_case(buckets: &NcclBuckets, mesh: &dyn Collective, kind: CaseKind) -> InPlaceCase {
    let rank = mesh.rank();
    // The layout as built, and the branch device_memory takes for it.
    let built = kind.build(rank, 0, buckets.device());
    let values = kind.values(rank, 0);
    let as_built = read(&built.tensor).and_then(|got| same(&got, &values, true));
    let (memory, access, offset) = check_device_memory(kind, built, &values);
    // In the order run: each check builds its own tensor.
    let results = [
        ("built", as_built),
        ("device_memory", memory),
        ("all_reduce", check_all_reduce(buckets, mesh, kind)),
        ("all_gather_from", check_all_gather_from(buckets, mesh, kind)),
        ("all_gather_into", check_all_gather_into(buckets, mesh, kind)),
    ];
    let checks: Vec<CaseCheck> = results
        .into_iter()
        .map(|(check, result)| {
            let (passed, detail) = match result {
                Ok(d) => (true, d),
                Err(d) => (false, d),
            };
            CaseCheck { check, passed, detail }
        })
        .collect();
    let passed = checks.iter().all(|c| c.passed);
    InPlaceCase { case: kind, access, offset_bytes: offset, passed, checks }
}

/// `device_memory` on the case as built: the branch it takes and the byte
/// offset it reports, the values it reaches, and the buffer's other tensors.
fn check_device_memory(
    kind: CaseKind,
    built: Built,
    values: &[f32],
) -> (Result<String, String>, Option<Access>, Option<u64>) {
    let (want_access, want_offset) = kind.expected();
    let (mut access, mut offset) = (None, None);
    let result = device_memory(built.tensor).map_err(|e| e.to_string()).and_then(|m| {
        (access, offset) = (Some(m.access), Some(m.offset_bytes));
        if (m.access, m.offset_bytes) != (want_access, want_offset) {
            return Err(format!(
                "reached as {:?} at byte offset {}; the case exists for {want_access:?} at {want_offset}",
                m.access, m.offset_bytes
            ));
        }
        same(&read(&m.tensor)?, values, true)?;
        untouched(&built.sharers)?;
        Ok(format!("{:?} at byte offset {}, values kept", m.access, m.offset_bytes))
    });
    (result, access, offset)
}

/// The bucket all-reduce (average), as the replica calls it.
fn check_all_reduce(buckets: &NcclBuckets, mesh: &dyn Collective, kind: CaseKind) -> Result<String, String> {
    let (rank, world) = (mesh.rank(), mesh.world_size());
    let built = kind.build(rank, 1, buckets.device());
    let name = format!("in-place.{kind:?}.all_reduce");
    let reduced = buckets
        .all_reduce_bucket(mesh, &name, built.tensor, ReduceOptions::average())
        .map_err(|e| e.to_string())?;
    let want = average(&(0..world).map(|q| kind.values(q, 1)).collect::<Vec<_>>());
    same(&read(&reduced)?, &want, world.is_power_of_two())?;
    untouched(&built.sharers)?;
    Ok(format!("the average over {world} rank(s), sharers unchanged"))
}

/// From the case's tensor into a fresh one: the send address is the first byte.
fn check_all_gather_from(
    buckets: &NcclBuckets,
    mesh: &dyn Collective,
    kind: CaseKind,
) -> Result<String, String> {
    let (rank, world, device) = (mesh.rank(), mesh.world_size(), buckets.device());
    let built = kind.build(rank, 2, device);
    let recv = Tensor::<Cuda, 1>::zeros([world * LEN], device);
    let name = format!("in-place.{kind:?}.all_gather_from");
    let (send, recv) = buckets.all_gather_into(mesh, &name, built.tensor, recv).map_err(|e| e.to_string())?;
    let want: Vec<f32> = (0..world).flat_map(|q| kind.values(q, 2)).collect();
    same(&read(&recv)?, &want, true)?;
    same(&read(&send)?, &kind.values(rank, 2), true).map_err(|e| format!("the source changed: {e}"))?;
    untouched(&built.sharers)?;
    Ok("gathered bit for bit; source and sharers unchanged".into())
}

/// From a fresh tensor into the case's: the receive address is the first
/// byte, and a shared buffer is copied before it is written.
fn check_all_gather_into(
    buckets: &NcclBuckets,
    mesh: &dyn Collective,
    kind: CaseKind,
) -> Result<String, String> {
    let (rank, world, device) = (mesh.rank(), mesh.world_size(), buckets.device());
    if !LEN.is_multiple_of(world) {
        return Ok(format!("not run: {LEN} elements do not split over {world} ranks"));
    }
    let part = LEN / world;
    let fresh = |q: usize| (0..part).map(|i| value(q, 3, i)).collect::<Vec<f32>>();
    let built = kind.build(rank, 4, device);
    let send = Tensor::<Cuda, 1>::from_data(TensorData::new(fresh(rank), [part]), device);
    let name = format!("in-place.{kind:?}.all_gather_into");
    let (_, recv) = buckets.all_gather_into(mesh, &name, send, built.tensor).map_err(|e| e.to_string())?;
    let want: Vec<f32> = (0..world).flat_map(fresh).collect();
    same(&read(&recv)?, &want, true)?;
    untouched(&built.sharers)?;
    Ok("written bit for bit; sharers unchanged".into())
}

/// A tensor's values, read back through burn.
fn read(tensor: &Tensor<Cuda, 1>) -> Result<Vec<f32>, String> {
    tensor.clone().into_data().to_vec::<f32>().map_err(|e| format!("reading a tensor back: {e:?}"))
}

/// The tensors sharing a case's buffer still hold what they held.
fn untouched(sharers: &[(Tensor<Cuda, 1>, Vec<f32>)]) -> Result<(), String> {
    for (i, (tensor, values)) in sharers.iter().enumerate() {
        same(&read(tensor)?, values, true)
            .map_err(|e| format!("a tensor sharing the buffer (#{i}) changed: {e}"))?;
    }
    Ok(())
}

/// The element-wise mean over ranks, summed in rank order in f64.
fn average(per_rank: &[Vec<f32>]) -> Vec<f32> {
    let n = per_rank.len() as f64;
    (0..per_rank[0].len())
        .map(|i| (per_rank.iter().map(|v| f64::from(v[i])).sum::<f64>() / n) as f32)
        .collect()
}

/// `got == want`, bit for bit when `exact`, else within 1e-6 relative; the
/// error names the first difference and how many there are.
fn same(got: &[f32], want: &[f32], exact: bool) -> Result<String, String> {
    if got.len() != want.len() {
        return Err(format!("{} values where {} were expected", got.len(), want.len()));
    }
    let differs =
        |a: f32, b: f32| if exact { a.to_bits() != b.to_bits() } else { (a - b).abs() > 1e-6 * b.abs() };
    let bad: Vec<usize> = (0..got.len()).filter(|&i| differs(got[i], want[i])).collect();
    match bad.first() {
        None => Ok(format!("{} values equal", got.len())),
        Some(&i) => Err(format!(
            "{} of {} values differ, the first at {i}: {} where {} was expected",
            bad.len(),
            got.len(),
            got[i],
            want[i]
        )),
    }
}

//! A rank process for drove-comm's multi-process tests: the test binary run
//! again with `DROVE_COMM_TEST_WORKER` set to the scenario's arguments runs
//! one scenario and prints one JSON line. N copies get `DROVE_RANK`, `DROVE_WORLD_SIZE`
//! and `DROVE_RENDEZVOUS_DIR` (or `DROVE_PEERS`) set; `DROVE_COMM_TRANSPORT`
//! and `DROVE_COMM_TIMEOUT` choose the transport and the deadline, `DROVE_HOST_ID`
//! which ranks count as one host. The line also says which transport ran.
//! (Test code: it reads these variables itself, see [`var`].)
//!
//! Scenarios: `closed-form`, `errors`, `kill VICTIM BYTES MIB`, `stall VICTIM`,
//! `fusion`, `sum-rank`. Logs (stall warnings) go to stderr.

use std::io::Write as _;
use std::time::{Duration, Instant};

use drove_collective::fusion::{Compression, FusionOptions, all_reduce_fused};
use drove_collective::{
    Buffer, Collective, CommError, Element, Place, ReduceOp, ReduceOptions, RowsSent, all_reduce_rows, bf16,
    f16,
};
use drove_comm::{CommOptions, Communicator, FileRendezvous, StaticRendezvous, parse_peers};

/// A variable of the worker's environment. This test code reads the launch
/// contract's variables itself: drove-launch, their one reader everywhere
/// else, depends on this crate, so it cannot be a dependency of its tests.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn number(name: &str) -> Result<usize, CommError> {
    let v = var(name).ok_or_else(|| CommError::Rendezvous(format!("{name} is not set")))?;
    v.trim().parse().map_err(|_| CommError::Rendezvous(format!("{name}={v:?} is not a whole number")))
}

/// `DROVE_COMM_TIMEOUT` (seconds), `DROVE_COMM_TRANSPORT` and `DROVE_HOST_ID`
/// over the defaults, as drove-launch reads them.
fn options() -> Result<CommOptions, CommError> {
    let mut o = CommOptions::default();
    if let Some(v) = var("DROVE_COMM_TIMEOUT") {
        let t = v.parse::<f64>().ok().filter(|s| s.is_finite() && *s > 0.0).ok_or_else(|| {
            CommError::Rendezvous(format!("DROVE_COMM_TIMEOUT={v:?} is not a positive number of seconds"))
        })?;
        o.timeout = Duration::from_secs_f64(t);
        o.warn_after = o.warn_after.min(o.timeout / 3);
    }
    if let Some(v) = var("DROVE_COMM_TRANSPORT") {
        o.transport = v.parse().map_err(CommError::Rendezvous)?;
    }
    o.host_id = var("DROVE_HOST_ID").filter(|id| !id.is_empty());
    Ok(o)
}

/// Through `DROVE_RENDEZVOUS_DIR`, else the addresses of `DROVE_PEERS_FILE`.
fn connect(fault: Option<u64>) -> Result<Communicator, CommError> {
    let mut opts = options()?;
    opts.fault_kill_after_bytes = fault;
    let place = Place::new(number("DROVE_RANK")?, number("DROVE_WORLD_SIZE")?)?;
    if let Some(dir) = var("DROVE_RENDEZVOUS_DIR") {
        Communicator::connect(&FileRendezvous::new(dir, place), opts)
    } else {
        let file = var("DROVE_PEERS_FILE").ok_or_else(|| {
            CommError::Rendezvous("neither DROVE_RENDEZVOUS_DIR nor DROVE_PEERS_FILE is set".into())
        })?;
        let text = std::fs::read_to_string(&file).map_err(|e| CommError::io(format!("reading {file}"), e))?;
        let peers = parse_peers(&text, '\n', "DROVE_PEERS_FILE")?;
        Communicator::connect(&StaticRendezvous::new(place.rank(), peers)?, opts)
    }
}

/// A value type the closed-form checks can build from small integers.
trait Num: Element + Copy + PartialEq + std::fmt::Debug {
    fn from_i64(v: i64) -> Self;
    fn to_f64(self) -> f64;
}
macro_rules! num {
    ($t:ty, $from:expr, $to:expr) => {
        impl Num for $t {
            fn from_i64(v: i64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
        }
    };
}
num!(f32, |v| v as f32, |x: f32| x as f64);
num!(f64, |v| v as f64, |x: f64| x);
num!(f16, |v| f16::from_f64(v as f64), |x: f16| x.to_f64());
num!(bf16, |v| bf16::from_f64(v as f64), |x: bf16| x.to_f64());
num!(i32, |v| v as i32, |x: i32| x as f64);
num!(i64, |v| v, |x: i64| x as f64);

/// The same pseudo-random small integers on every rank (xorshift on a fixed seed).
fn base(n: usize, lo: i64, hi: i64, salt: u64) -> Vec<i64> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ salt;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (s % (hi - lo) as u64) as i64
        })
        .collect()
}

struct Checks {
    count: usize,
    failures: Vec<String>,
}

impl Checks {
    fn close<T: Num>(&mut self, what: &str, got: &[T], want: &[f64], exact: bool) {
        self.count += 1;
        if got.len() != want.len() {
            self.failures.push(format!("{what}: {} elements, expected {}", got.len(), want.len()));
            return;
        }
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let g = g.to_f64();
            let ok = if exact { g == *w } else { (g - w).abs() <= 1e-4 * w.abs().max(1.0) };
            if !ok {
                self.failures.push(format!("{what}: element {i} is {g}, expected {w}"));
                return;
            }
        }
    }

    fn ok(&mut self, what: &str, r: Result<(), CommError>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                self.count += 1;
                self.failures.push(format!("{what}: {e}"));
                false
            }
        }
    }
}

/// One shape of the closed-form checks: every rank holds `t` shifted by its rank.
struct Case<'a> {
    comm: &'a Communicator,
    rank: i64,
    size: i64,
    dim: usize,
    shape: Vec<usize>,
    t: Vec<i64>,
    /// `DTYPE dim DIM`, in every check's name.
    tag: String,
    /// Whether sums are compared exactly.
    exact: bool,
}

impl Case<'_> {
    fn rank_sum(&self) -> i64 {
        self.size * (self.size - 1) / 2
    }
}

fn mk<T: Num>(v: &[i64]) -> Vec<T> {
    v.iter().map(|&x| T::from_i64(x)).collect()
}

fn shifted(v: &[i64], by: i64) -> Vec<i64> {
    v.iter().map(|&x| x + by).collect()
}

fn closed_form_for<T: Num>(comm: &Communicator, c: &mut Checks) {
    let (rank, size) = (comm.rank() as i64, comm.world_size() as i64);
    let dtype = T::DTYPE;
    // Sums of small integers are exact in every type; the goal allows 1e-4 above 3 ranks.
    let exact = !dtype.is_float() || size <= 3;
    for dim in 1..=3usize {
        let shape = vec![17usize; dim];
        let n: usize = shape.iter().product();
        let t = base(n, -8, 8, dim as u64);
        let tag = format!("{dtype} dim {dim}");
        let case = Case { comm, rank, size, dim, shape, t, tag, exact };
        reductions::<T>(&case, c);
        product::<T>(&case, c);
        if dtype.is_float() {
            scaled_sum::<T>(&case, c);
        }
        broadcasts::<T>(&case, c);
        all_gather::<T>(&case, c);
        reduce_scatter::<T>(&case, c);
    }
}

/// Sum, min, max and average of the shifted tensors.
fn reductions<T: Num>(case: &Case<'_>, c: &mut Checks) {
    let (t, size, rank_sum, dtype) = (&case.t, case.size, case.rank_sum(), T::DTYPE);
    for (op, want) in [
        (ReduceOp::Sum, t.iter().map(|&x| (x * size + rank_sum) as f64).collect::<Vec<_>>()),
        (ReduceOp::Min, t.iter().map(|&x| x as f64).collect()),
        (ReduceOp::Max, t.iter().map(|&x| (x + size - 1) as f64).collect()),
        (
            ReduceOp::Average,
            t.iter()
                .map(|&x| {
                    let s = x * size + rank_sum;
                    if dtype.is_float() { s as f64 / size as f64 } else { (s / size) as f64 }
                })
                .collect(),
        ),
    ] {
        let mut data = mk::<T>(&shifted(t, case.rank));
        let name = format!("{op} {}", case.tag);
        let r = case.comm.all_reduce(&name, &case.shape, T::tensor_mut(&mut data), ReduceOptions::new(op));
        if c.ok(&name, r) {
            let exact = case.exact && (op != ReduceOp::Average || !dtype.is_float());
            c.close(&name, &data, &want, exact || matches!(op, ReduceOp::Min | ReduceOp::Max));
        }
    }
}

/// Product of {-2, -1, 1, 2}: at most 2^size in magnitude, exact.
fn product<T: Num>(case: &Case<'_>, c: &mut Checks) {
    let n = case.t.len();
    let p =
        base(n, 0, 4, 7 + case.dim as u64).iter().map(|&x| [-2, -1, 1, 2][x as usize]).collect::<Vec<i64>>();
    let mut data = mk::<T>(&p);
    let name = format!("product {}", case.tag);
    if c.ok(
        &name,
        case.comm.all_reduce(
            &name,
            &case.shape,
            T::tensor_mut(&mut data),
            ReduceOptions::new(ReduceOp::Product),
        ),
    ) {
        c.close(
            &name,
            &data,
            &p.iter().map(|&x| (x as f64).powi(case.size as i32)).collect::<Vec<_>>(),
            true,
        );
    }
}

/// Pre- and post-scaling (floats): 0.5 * x on every rank, summed, times 3.
fn scaled_sum<T: Num>(case: &Case<'_>, c: &mut Checks) {
    let mut data = mk::<T>(&shifted(&case.t, case.rank));
    let name = format!("scaled sum {}", case.tag);
    let opts = ReduceOptions::sum().prescale(0.5).postscale(3.0);
    if c.ok(&name, case.comm.all_reduce(&name, &case.shape, T::tensor_mut(&mut data), opts)) {
        let want: Vec<f64> = case.t.iter().map(|&x| 1.5 * (x * case.size + case.rank_sum()) as f64).collect();
        c.close(
            &name,
            &data,
            &want,
            !matches!(T::DTYPE, drove_collective::DType::F16 | drove_collective::DType::BF16) && case.exact,
        );
    }
}

/// Broadcast from every root: the root's tensor everywhere, the root's unchanged.
fn broadcasts<T: Num>(case: &Case<'_>, c: &mut Checks) {
    for root in 0..case.size {
        let mut data = mk::<T>(&shifted(&case.t, case.rank));
        let name = format!("broadcast from {root} {}", case.tag);
        if c.ok(&name, case.comm.broadcast(&name, &case.shape, T::tensor_mut(&mut data), root as usize)) {
            c.close(
                &name,
                &data,
                &shifted(&case.t, root).iter().map(|&x| x as f64).collect::<Vec<_>>(),
                true,
            );
        }
    }
}

/// All-gather, first dimension 17 + rank.
fn all_gather<T: Num>(case: &Case<'_>, c: &mut Checks) {
    let (rank, size) = (case.rank, case.size);
    let mut gshape = case.shape.clone();
    gshape[0] = 17 + rank as usize;
    let row: usize = case.shape[1..].iter().product();
    let mine: Vec<i64> = (0..gshape[0] * row).map(|i| rank * 50 + (i % 50) as i64).collect();
    let name = format!("all_gather {}", case.tag);
    match case.comm.all_gather(&name, &gshape, T::tensor_ref(&mk::<T>(&mine))) {
        Ok(g) => {
            let want: Vec<f64> = (0..size)
                .flat_map(|r| (0..(17 + r as usize) * row).map(move |i| (r * 50 + (i % 50) as i64) as f64))
                .collect();
            let got = T::from_buffer(g.data).expect("same dtype back");
            c.close(&name, &got, &want, true);
            c.count += 1;
            if g.first_dims != (0..size as usize).map(|r| 17 + r).collect::<Vec<_>>() {
                c.failures.push(format!("{name}: first dims {:?}", g.first_dims));
            }
        }
        Err(e) => c.failures.push(format!("{name}: {e}")),
    }
}

/// Reduce-scatter: this rank's rows of T, times the world size.
fn reduce_scatter<T: Num>(case: &Case<'_>, c: &mut Checks) {
    let (rank, size) = (case.rank, case.size);
    let row: usize = case.shape[1..].iter().product();
    let mut rshape = case.shape.clone();
    rshape[0] = 2 * size as usize + 1;
    let rn: usize = rshape.iter().product();
    let rt = base(rn, -8, 8, 11 + case.dim as u64);
    let name = format!("reduce_scatter {}", case.tag);
    match case.comm.reduce_scatter(&name, &rshape, T::tensor_ref(&mk::<T>(&rt)), ReduceOptions::sum()) {
        Ok(g) => {
            let rows_before: usize = g.first_dims[..rank as usize].iter().sum();
            let mine = &rt[rows_before * row..(rows_before + g.first_dims[rank as usize]) * row];
            let want: Vec<f64> = mine.iter().map(|&x| (x * size) as f64).collect();
            let got = T::from_buffer(g.data).expect("same dtype back");
            c.close(&name, &got, &want, true);
        }
        Err(e) => c.failures.push(format!("{name}: {e}")),
    }
}

fn closed_form(comm: &Communicator) -> serde_json::Value {
    let mut c = Checks { count: 0, failures: Vec::new() };
    closed_form_for::<f32>(comm, &mut c);
    closed_form_for::<f64>(comm, &mut c);
    closed_form_for::<f16>(comm, &mut c);
    closed_form_for::<bf16>(comm, &mut c);
    closed_form_for::<i32>(comm, &mut c);
    closed_form_for::<i64>(comm, &mut c);
    // Async forms, in order with sync ones.
    let pending: Vec<_> = (0..4)
        .map(|i| {
            comm.all_reduce_async(
                &format!("async {i}"),
                &[3],
                Buffer::from(vec![i as f64; 3]),
                ReduceOptions::sum(),
            )
        })
        .collect();
    let mut sync = vec![1i32; 5];
    let sync_ok = comm.all_reduce("sync after async", &[5], i32::tensor_mut(&mut sync), ReduceOptions::sum());
    c.ok("sync after async", sync_ok);
    for (i, p) in pending.into_iter().enumerate() {
        match p.wait() {
            Ok(b) => c.close(
                &format!("async {i}"),
                &f64::from_buffer(b).expect("f64"),
                &[(i * comm.world_size()) as f64; 3],
                true,
            ),
            Err(e) => c.failures.push(format!("async {i}: {e}")),
        }
    }
    c.close("sync after async", &sync, &[comm.world_size() as f64; 5], true);
    let b =
        comm.broadcast_async("async broadcast", &[2], Buffer::from(vec![comm.rank() as i64; 2]), 1).wait();
    match b {
        Ok(b) => c.close("async broadcast", &i64::from_buffer(b).expect("i64"), &[1.0, 1.0], true),
        Err(e) => c.failures.push(format!("async broadcast: {e}")),
    }
    c.ok("barrier", comm.barrier("end"));
    serde_json::json!({ "checks": c.count, "failures": c.failures })
}

fn errors(comm: &Communicator) -> serde_json::Value {
    let (rank, size) = (comm.rank(), comm.world_size());
    let mut out = Vec::new();
    let mut after = Vec::new();
    let mut check_usable = |comm: &Communicator, i: usize| {
        let mut v = vec![rank as f32 + 1.0; 7];
        let r = comm.all_reduce(&format!("after {i}"), &[7], f32::tensor_mut(&mut v), ReduceOptions::sum());
        let want = (size * (size + 1) / 2) as f32;
        after.push(r.is_ok() && v.iter().all(|&x| x == want));
    };
    // 1. Shapes that differ: [17 + r]^3.
    let d = 17 + rank;
    let mut t = vec![1f32; d * d * d];
    out.push(comm.all_reduce("shapes", &[d, d, d], f32::tensor_mut(&mut t), ReduceOptions::sum()));
    check_usable(comm, 1);
    // 2. Same element count, different number of dimensions.
    let shape: &[usize] = if rank % 2 == 0 { &[17, 1311] } else { &[17, 23, 57] };
    let mut t = vec![1f32; 17 * 1311];
    out.push(comm.all_reduce("ranks of shapes", shape, f32::tensor_mut(&mut t), ReduceOptions::sum()));
    check_usable(comm, 2);
    // 3. i32 on even ranks, f32 on odd ones.
    let r = if rank % 2 == 0 {
        let mut t = vec![1i32; 10];
        comm.all_reduce("dtypes", &[10], i32::tensor_mut(&mut t), ReduceOptions::sum())
    } else {
        let mut t = vec![1f32; 10];
        comm.all_reduce("dtypes", &[10], f32::tensor_mut(&mut t), ReduceOptions::sum())
    };
    out.push(r);
    check_usable(comm, 3);
    // 4. Every rank names itself as root.
    let mut t = vec![rank as f64; 4];
    out.push(comm.broadcast("roots", &[4], f64::tensor_mut(&mut t), rank));
    check_usable(comm, 4);
    // 5. A local problem on one rank (wrong element count) fails everywhere.
    let mut t = vec![0f32; if rank == size - 1 { 5 } else { 6 }];
    out.push(comm.all_reduce("bad length", &[6], f32::tensor_mut(&mut t), ReduceOptions::sum()));
    check_usable(comm, 5);
    let errors: Vec<serde_json::Value> = out
        .into_iter()
        .map(|r| match r {
            Ok(()) => serde_json::json!({ "ok": true }),
            Err(e) => serde_json::json!({
                "ok": false,
                "recoverable": e.is_recoverable(),
                "field": match &e { CommError::Mismatch { field, .. } => *field, CommError::Invalid { .. } => "invalid", _ => "other" },
                "message": e.to_string(),
            }),
        })
        .collect();
    serde_json::json!({ "errors": errors, "usable_after": after })
}

fn kill(comm: &Communicator, mib: usize) -> serde_json::Value {
    let n = mib << 18; // f32 elements
    let mut t = vec![1f32; n];
    let start = Instant::now();
    let r = comm.all_reduce("big", &[n], f32::tensor_mut(&mut t), ReduceOptions::sum());
    let elapsed = start.elapsed();
    match r {
        Ok(()) => serde_json::json!({ "error": null, "elapsed_ms": elapsed.as_millis() as u64 }),
        Err(e) => serde_json::json!({
            "error": e.to_string(),
            "lost": matches!(e, CommError::PeerLost { .. }),
            "elapsed_ms": elapsed.as_millis() as u64,
        }),
    }
}

fn fusion(comm: &Communicator) -> serde_json::Value {
    let rank = comm.rank();
    // 200 tensors of mixed sizes, from 1 element to 300k.
    let sizes: Vec<usize> = (0..200).map(|i| [1, 7, 128, 1000, 4096, 65_537, 300_000][i % 7] + i).collect();
    let make = || -> Vec<Vec<f32>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| ((i * 31 + j * 7 + rank * 13) % 97) as f32 * 0.25).collect())
            .collect()
    };
    let mut unfused = make();
    let mut ok = true;
    for (i, t) in unfused.iter_mut().enumerate() {
        ok &= comm
            .all_reduce(&format!("t{i}"), &[t.len()], f32::tensor_mut(t), ReduceOptions::average())
            .is_ok();
    }
    let mut results = serde_json::Map::new();
    for (label, threshold, compression) in [
        ("fused_64mib", 64 << 20, Compression::None),
        ("fused_256kib", 256 << 10, Compression::None),
        ("unfused_0", 0, Compression::None),
        ("fused_f16", 64 << 20, Compression::F16),
        ("fused_bf16", 64 << 20, Compression::BF16),
    ] {
        let mut fused = make();
        let mut refs: Vec<&mut [f32]> = fused.iter_mut().map(|v| v.as_mut_slice()).collect();
        let r = all_reduce_fused(
            comm,
            label,
            &mut refs,
            ReduceOptions::average(),
            FusionOptions { threshold_bytes: threshold, compression },
        );
        let max_diff = fused
            .iter()
            .zip(&unfused)
            .flat_map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
            .fold(0f32, f32::max);
        results.insert(
            label.into(),
            serde_json::json!({ "ok": r.is_ok(), "error": r.err().map(|e| e.to_string()), "max_abs_diff": max_diff }),
        );
    }
    results.insert("rows".into(), rows(comm));
    serde_json::json!({ "unfused_ok": ok, "tensors": sizes.len(), "results": results })
}

/// A table of 1000 rows of 33 sent as its rows: rank 0 touches every third
/// of the first 60 rows, rank 1 every fifth of the first 100, the others
/// none; quarter values, so every order of the sum is exact and the rows
/// must equal the dense all-reduce.
fn rows(comm: &Communicator) -> serde_json::Value {
    let rank = comm.rank();
    let table = || -> Vec<f32> {
        let mut t = vec![0f32; 1000 * 33];
        let step = match rank {
            0 => Some((3, 60)),
            1 => Some((5, 100)),
            _ => None,
        };
        if let Some((every, below)) = step {
            for i in (0..below).step_by(every) {
                for j in 0..33 {
                    t[i * 33 + j] = ((i * 7 + j + rank) % 29) as f32 * 0.25 + 0.25;
                }
            }
        }
        t
    };
    let mut dense = table();
    let dense_ok =
        comm.all_reduce("rows.dense", &[dense.len()], f32::tensor_mut(&mut dense), ReduceOptions::average());
    let mut sparse = table();
    let sent = all_reduce_rows(comm, "rows.sparse", &mut sparse, 33, ReduceOptions::average());
    let max_diff = dense.iter().zip(&sparse).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    serde_json::json!({
        "ok": dense_ok.is_ok() && sent.is_ok(),
        "error": sent.as_ref().err().map(|e| e.to_string()),
        "sparse_rows": match sent { Ok(RowsSent::Sparse { rows }) => rows as i64, _ => -1 },
        "max_abs_diff": max_diff,
    })
}

fn run(args: Vec<String>) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let scenario = args.first().map(String::as_str).unwrap_or("");
    let arg = |i: usize| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(args.get(i).ok_or_else(|| format!("{scenario}: missing argument {i}"))?.parse()?)
    };
    const SCENARIOS: [&str; 6] = ["closed-form", "errors", "kill", "stall", "fusion", "sum-rank"];
    if !SCENARIOS.contains(&scenario) {
        return Err(format!("unknown scenario {scenario:?}: {}", SCENARIOS.join(", ")).into());
    }
    let rank = number("DROVE_RANK")?;
    let fault = if scenario == "kill" { (rank == arg(1)? as usize).then_some(arg(2)?) } else { None };
    let comm = connect(fault)?;
    let result = match scenario {
        "closed-form" => closed_form(&comm),
        "errors" => errors(&comm),
        "kill" => kill(&comm, arg(3)? as usize),
        "stall" => {
            let victim = arg(1)? as usize;
            if rank == victim {
                // Connected, but never joins the op: blocks until the parent closes stdin.
                std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())?;
                serde_json::json!({ "stalled": true })
            } else {
                let start = Instant::now();
                let mut v = [1f32; 16];
                let r = comm.all_reduce("stalled op", &[16], f32::tensor_mut(&mut v), ReduceOptions::sum());
                serde_json::json!({
                    "error": r.err().map(|e| e.to_string()),
                    "elapsed_ms": start.elapsed().as_millis() as u64,
                })
            }
        }
        "fusion" => fusion(&comm),
        _ => {
            let mut v = [comm.rank() as i64];
            comm.all_reduce("sum-rank", &[1], i64::tensor_mut(&mut v), ReduceOptions::sum())?;
            serde_json::json!({ "sum": v[0] })
        }
    };
    Ok(serde_json::json!({ "rank": rank, "transport": comm.transport(), "result": result }))
}

/// Runs the scenario `args` names, prints its JSON line, and ends the process
/// (0: it ran; 1: an error, on stderr).
pub fn main(args: &str) -> ! {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false).init();
    let code = match run(args.split_whitespace().map(str::to_string).collect()) {
        Ok(v) => {
            println!("{v}");
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    std::io::stdout().flush().ok();
    std::process::exit(code)
}

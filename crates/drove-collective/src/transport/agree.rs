//! The agreement check: every rank's [`OpDesc`] of one op, compared field by
//! field. Every rank checks the same list, so every rank fails alike, with
//! the same message naming the field and the ranks.

use std::fmt::{self, Display};

use crate::dtype::{DType, ReduceOp};
use crate::error::CommError;
use crate::op::{OpDesc, OpKind};

struct Shape<'a>(&'a [usize]);

impl Display for Shape<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

/// "v1 on ranks [0, 2]; v2 on rank 1", values in order of first appearance.
fn groups<T: PartialEq>(values: &[T], show: impl Fn(&T) -> String) -> String {
    let mut seen: Vec<(&T, Vec<usize>)> = Vec::new();
    for (rank, v) in values.iter().enumerate() {
        match seen.iter_mut().find(|(s, _)| *s == v) {
            Some((_, ranks)) => ranks.push(rank),
            None => seen.push((v, vec![rank])),
        }
    }
    seen.iter()
        .map(|(v, ranks)| {
            if ranks.len() == 1 {
                format!("{} on rank {}", show(v), ranks[0])
            } else {
                format!("{} on ranks {:?}", show(v), ranks)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks that every rank describes the same op (`descs` by rank). The
/// result is the same on every rank, since every rank checks the same list.
pub fn agree(descs: &[OpDesc]) -> Result<(), CommError> {
    let Some(first) = descs.first() else { return Ok(()) };
    let op = first.label();
    let problems: Vec<String> = descs
        .iter()
        .enumerate()
        .filter_map(|(r, d)| Some(format!("rank {r}: {}", d.problem.as_deref()?)))
        .collect();
    if !problems.is_empty() {
        return Err(CommError::Invalid { op, message: problems.join("; ") });
    }
    let mismatch =
        |field: &'static str, values: String| Err(CommError::Mismatch { op: op.clone(), field, values });
    macro_rules! field {
        ($name:literal, $get:expr, $show:expr) => {{
            let vals: Vec<_> = descs.iter().map($get).collect();
            if vals.iter().any(|v| *v != vals[0]) {
                return mismatch($name, groups(&vals, $show));
            }
        }};
    }
    field!("the operation", |d: &OpDesc| (d.kind, d.name.clone()), |(k, n): &(OpKind, String)| format!(
        "{k} {n:?}"
    ));
    field!("the op sequence number", |d: &OpDesc| d.seq, |s: &u64| format!("op #{s}"));
    field!("dtype", |d: &OpDesc| d.dtype, |t: &DType| t.to_string());
    field!("reduce op", |d: &OpDesc| d.reduce.map(|r| r.op), |r: &Option<ReduceOp>| r
        .map_or("none".into(), |r| r.to_string()));
    field!("prescale factor", |d: &OpDesc| scale(d).0.to_bits(), |b: &u64| f64::from_bits(*b).to_string());
    field!("postscale factor", |d: &OpDesc| scale(d).1.to_bits(), |b: &u64| f64::from_bits(*b).to_string());
    field!("root", |d: &OpDesc| d.root as u32, |r: &u32| format!("root {r}"));
    if first.kind == OpKind::AllGather {
        field!(
            "shape after the first dimension",
            |d: &OpDesc| d.shape.get(1..).unwrap_or(&[]).to_vec(),
            |s: &Vec<usize>| Shape(s).to_string()
        );
        field!("number of dimensions", |d: &OpDesc| d.shape.len(), |n: &usize| n.to_string());
    } else {
        field!("shape", |d: &OpDesc| d.shape.clone(), |s: &Vec<usize>| Shape(s).to_string());
    }
    Ok(())
}

/// An op's (prescale, postscale): 1 and 1 when it does not reduce.
fn scale(d: &OpDesc) -> (f64, f64) {
    d.reduce.map_or((1.0, 1.0), |r| (r.prescale, r.postscale))
}

impl OpDesc {
    /// The same op, its `problem` set from what this rank's own arguments
    /// say, as every transport checks them: a first dimension where the op
    /// needs one, `shape` against the tensor's `len` elements, the scale
    /// factors against the dtype, the root against `world`.
    pub fn checked(self, len: usize, world: usize) -> OpDesc {
        let needs_rows = matches!(self.kind, OpKind::AllGather | OpKind::ReduceScatter);
        let problem = if needs_rows && self.shape.is_empty() {
            Some(format!("{} needs a tensor with at least one dimension", self.kind))
        } else {
            shape_problem(&self.shape, len)
                .or_else(|| self.reduce.and_then(|r| scale_problem(self.dtype, &r)))
                .or_else(|| {
                    (self.kind == OpKind::Broadcast && self.root >= world)
                        .then(|| format!("root {} is out of range for world size {world}", self.root))
                })
        };
        self.with_problem(problem)
    }
}

/// Why `shape` does not describe a tensor of `len` elements, if it does not.
pub fn shape_problem(shape: &[usize], len: usize) -> Option<String> {
    match shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) {
        Some(n) if n == len => None,
        Some(n) => Some(format!("shape {shape:?} holds {n} elements but the tensor has {len}")),
        None => Some(format!("shape {shape:?} overflows")),
    }
}

/// Why `opts` cannot reduce elements of `dtype`, if they cannot (scale
/// factors on integers, or factors that are not finite).
pub fn scale_problem(dtype: DType, opts: &crate::op::ReduceOptions) -> Option<String> {
    if !dtype.is_float() && (opts.prescale != 1.0 || opts.postscale != 1.0) {
        return Some(format!(
            "scale factors apply to floating-point tensors only (found {dtype} with prescale {} and postscale {})",
            opts.prescale, opts.postscale
        ));
    }
    if !opts.prescale.is_finite() || !opts.postscale.is_finite() {
        return Some(format!(
            "scale factors must be finite (prescale {}, postscale {})",
            opts.prescale, opts.postscale
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::ReduceOptions;

    fn desc(shape: &[usize]) -> OpDesc {
        OpDesc {
            seq: 3,
            ..OpDesc::new(OpKind::AllReduce, "grad", DType::F32, shape).reducing(ReduceOptions::sum())
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let d = OpDesc {
            name: "a.b/ü".into(),
            reduce: Some(ReduceOptions::average().prescale(0.5)),
            problem: Some("bad".into()),
            ..desc(&[17, 23, 57])
        };
        let frame = d.encode();
        assert_eq!(u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize, frame.len() - 4);
        assert_eq!(OpDesc::decode(&frame[4..]).unwrap(), d);
        assert!(OpDesc::decode(&frame[4..frame.len() - 1]).is_none());
    }

    #[test]
    fn mismatches_name_the_field_and_the_ranks() {
        let descs = vec![desc(&[17, 1311]), desc(&[17, 23, 57]), desc(&[17, 1311])];
        let err = agree(&descs).unwrap_err().to_string();
        assert_eq!(
            err,
            "all_reduce \"grad\": ranks disagree on shape: [17, 1311] on ranks [0, 2]; [17, 23, 57] on rank 1"
        );
        let mut d1 = desc(&[4]);
        d1.dtype = DType::I32;
        let err = agree(&[desc(&[4]), d1]).unwrap_err().to_string();
        assert!(err.contains("dtype: f32 on rank 0; i32 on rank 1"), "{err}");
        assert!(agree(&[desc(&[4]), desc(&[4])]).is_ok());
    }
}

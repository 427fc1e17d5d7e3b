//! The description of an op that every rank sends to every other before data
//! moves, and the agreement check over all of them.

use std::fmt::{self, Display};

use crate::dtype::{DType, ReduceOp};
use crate::error::CommError;

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    AllReduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    Barrier,
    Shutdown,
}

impl OpKind {
    fn code(self) -> u8 {
        self as u8
    }
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => OpKind::AllReduce,
            1 => OpKind::Broadcast,
            2 => OpKind::AllGather,
            3 => OpKind::ReduceScatter,
            4 => OpKind::Barrier,
            5 => OpKind::Shutdown,
            _ => return None,
        })
    }
}

impl Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::Barrier => "barrier",
            OpKind::Shutdown => "shutdown",
        })
    }
}

/// What one rank is about to do.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OpDesc {
    pub seq: u64,
    pub kind: OpKind,
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    pub reduce: Option<ReduceOp>,
    pub prescale: f64,
    pub postscale: f64,
    pub root: u32,
    /// Why this rank's arguments are invalid; empty when they are fine.
    pub problem: String,
}

impl OpDesc {
    pub fn label(&self) -> String {
        format!("{} {:?}", self.kind, self.name)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(64 + self.name.len() + 8 * self.shape.len());
        b.extend_from_slice(&[0u8; 4]); // frame length, filled below
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.push(self.kind.code());
        b.push(self.dtype.code());
        b.push(self.reduce.map_or(255, ReduceOp::code));
        b.extend_from_slice(&self.root.to_le_bytes());
        b.extend_from_slice(&self.prescale.to_bits().to_le_bytes());
        b.extend_from_slice(&self.postscale.to_bits().to_le_bytes());
        b.extend_from_slice(&(self.shape.len() as u32).to_le_bytes());
        for d in &self.shape {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        b.extend_from_slice(self.name.as_bytes());
        b.extend_from_slice(&(self.problem.len() as u32).to_le_bytes());
        b.extend_from_slice(self.problem.as_bytes());
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_le_bytes());
        b
    }

    /// Decodes a frame body (without its length prefix).
    pub fn decode(body: &[u8]) -> Option<OpDesc> {
        let mut r = Reader(body);
        let seq = r.u64()?;
        let kind = OpKind::from_code(r.u8()?)?;
        let dtype = DType::from_code(r.u8()?)?;
        let reduce = match r.u8()? {
            255 => None,
            c => Some(ReduceOp::from_code(c)?),
        };
        let root = r.u32()?;
        let prescale = f64::from_bits(r.u64()?);
        let postscale = f64::from_bits(r.u64()?);
        let ndim = r.u32()? as usize;
        if ndim > 64 {
            return None;
        }
        let shape = (0..ndim).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
        let name_len = r.u32()? as usize;
        let name = String::from_utf8(r.take(name_len)?.to_vec()).ok()?;
        let problem_len = r.u32()? as usize;
        let problem = String::from_utf8(r.take(problem_len)?.to_vec()).ok()?;
        Some(OpDesc { seq, kind, name, dtype, shape, reduce, prescale, postscale, root, problem })
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

struct Shape<'a>(&'a [u64]);

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

/// Checks that every rank describes the same op. The result is the same on every
/// rank, since every rank checks the same list.
pub(crate) fn check(descs: &[OpDesc]) -> Result<(), CommError> {
    let first = &descs[0];
    let op = first.label();
    let problems: Vec<String> = descs
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.problem.is_empty())
        .map(|(r, d)| format!("rank {r}: {}", d.problem))
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
    field!("reduce op", |d: &OpDesc| d.reduce, |r: &Option<ReduceOp>| r
        .map_or("none".into(), |r| r.to_string()));
    field!("prescale factor", |d: &OpDesc| d.prescale.to_bits(), |b: &u64| f64::from_bits(*b).to_string());
    field!("postscale factor", |d: &OpDesc| d.postscale.to_bits(), |b: &u64| f64::from_bits(*b).to_string());
    field!("root", |d: &OpDesc| d.root, |r: &u32| format!("root {r}"));
    if first.kind == OpKind::AllGather {
        field!(
            "shape after the first dimension",
            |d: &OpDesc| d.shape.get(1..).unwrap_or(&[]).to_vec(),
            |s: &Vec<u64>| Shape(s).to_string()
        );
        field!("number of dimensions", |d: &OpDesc| d.shape.len(), |n: &usize| n.to_string());
    } else {
        field!("shape", |d: &OpDesc| d.shape.clone(), |s: &Vec<u64>| Shape(s).to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(shape: &[u64]) -> OpDesc {
        OpDesc {
            seq: 3,
            kind: OpKind::AllReduce,
            name: "grad".into(),
            dtype: DType::F32,
            shape: shape.to_vec(),
            reduce: Some(ReduceOp::Sum),
            prescale: 1.0,
            postscale: 1.0,
            root: 0,
            problem: String::new(),
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let d = OpDesc { name: "a.b/ü".into(), reduce: None, prescale: 0.5, ..desc(&[17, 23, 57]) };
        let frame = d.encode();
        assert_eq!(u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize, frame.len() - 4);
        assert_eq!(OpDesc::decode(&frame[4..]).unwrap(), d);
        assert!(OpDesc::decode(&frame[4..frame.len() - 1]).is_none());
    }

    #[test]
    fn mismatches_name_the_field_and_the_ranks() {
        let descs = vec![desc(&[17, 1311]), desc(&[17, 23, 57]), desc(&[17, 1311])];
        let err = check(&descs).unwrap_err().to_string();
        assert_eq!(
            err,
            "all_reduce \"grad\": ranks disagree on shape: [17, 1311] on ranks [0, 2]; [17, 23, 57] on rank 1"
        );
        let mut d1 = desc(&[4]);
        d1.dtype = DType::I32;
        let err = check(&[desc(&[4]), d1]).unwrap_err().to_string();
        assert!(err.contains("dtype: f32 on rank 0; i32 on rank 1"), "{err}");
        assert!(check(&[desc(&[4]), desc(&[4])]).is_ok());
    }
}

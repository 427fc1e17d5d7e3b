//! [`SingleProcess`]: a world of one.

use crate::collective::{Collective, Gathered};
use crate::dtype::{Buffer, TensorMut, TensorRef};
use crate::error::CommError;
use crate::op::ReduceOptions;
use crate::transport::reduce::{finish, scale_bytes};
use crate::transport::{scale_problem, shape_problem};

/// A world of one: every op is local. For single-process runs and tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce(
        &self,
        name: &str,
        shape: &[usize],
        mut data: TensorMut<'_>,
        opts: ReduceOptions,
    ) -> Result<(), CommError> {
        let dtype = data.dtype();
        if let Some(problem) = shape_problem(shape, data.len()).or_else(|| scale_problem(dtype, &opts)) {
            return Err(CommError::Invalid { op: format!("all_reduce {name:?}"), message: problem });
        }
        if dtype.is_float() {
            let bytes = data.bytes_mut();
            scale_bytes(dtype, opts.prescale, bytes);
            finish(dtype, opts.op, 1, opts.postscale, bytes);
        }
        Ok(())
    }
    fn broadcast(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorMut<'_>,
        root: usize,
    ) -> Result<(), CommError> {
        if let Some(problem) = shape_problem(shape, data.len()) {
            return Err(CommError::Invalid { op: format!("broadcast {name:?}"), message: problem });
        }
        if root != 0 {
            return Err(CommError::Invalid {
                op: format!("broadcast {name:?}"),
                message: format!("root {root} is out of range for world size 1"),
            });
        }
        Ok(())
    }
    fn all_gather(&self, name: &str, shape: &[usize], data: TensorRef<'_>) -> Result<Gathered, CommError> {
        if let Some(problem) =
            shape_problem(shape, data.len()).or_else(|| shape.is_empty().then(|| "needs a dimension".into()))
        {
            return Err(CommError::Invalid { op: format!("all_gather {name:?}"), message: problem });
        }
        let mut out = Buffer::zeros(data.dtype(), data.len());
        out.bytes_mut().copy_from_slice(data.bytes());
        Ok(Gathered { data: out, first_dims: vec![shape[0]], shape: shape.to_vec() })
    }
    fn reduce_scatter(
        &self,
        name: &str,
        shape: &[usize],
        data: TensorRef<'_>,
        opts: ReduceOptions,
    ) -> Result<Gathered, CommError> {
        let mut g = self.all_gather(name, shape, data)?;
        self.all_reduce(name, shape, g.data.as_mut(), opts)?;
        Ok(g)
    }
    fn barrier(&self, _name: &str) -> Result<(), CommError> {
        Ok(())
    }
}

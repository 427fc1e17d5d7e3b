//! The row-sparse all-reduce: a table whose gradient is zero but for a few
//! rows (an embedding, whose batch touched the rows of its tokens) is summed
//! across ranks by sending those rows, not the table.
//!
//! MiniLM's word embedding is 30522 rows of 384: 47 MB of its 91 MB of
//! gradients, of which a batch of 32 sentences touches a few hundred rows.
//! Its gradient is also the last that backward finishes, so a dense
//! all-reduce of it cannot hide behind backward on a slow link. Horovod sends
//! TensorFlow's `IndexedSlices` the same way (an all-gather of indices and
//! rows); PyTorch's `nn.Embedding(sparse=True)` is the same idea.
//!
//! Two all-gathers: each rank's touched row indices (every rank then knows
//! every count), then, if the rows of all ranks together are no more than the
//! table, the rows themselves; otherwise the table is all-reduced dense, a
//! choice every rank makes alike from the same counts. The rows are summed in
//! rank order, the first rank's copied and the others added, and finished as
//! a dense reduction finishes (averaged, post-scaled): the order in which
//! drove-comm's shared-memory all-reduce sums, so on one host the result is
//! that of the dense all-reduce bit for bit (up to the sign of a zero). The
//! rows travel as `f32`, whatever the fusion's compression.

use crate::collective::Collective;
use crate::dtype::{DType, Element, ReduceOp};
use crate::error::CommError;
use crate::op::ReduceOptions;
use crate::transport::reduce::{finish, scale_bytes};

/// How a row-sparse all-reduce moved the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowsSent {
    /// As the rows each rank touched: `rows` in all, over every rank.
    Sparse {
        /// Rows sent, summed over the ranks.
        rows: usize,
    },
    /// As a dense all-reduce: the ranks' rows together were more than the table.
    Dense,
}

/// All-reduces `data`, a row-major table of rows of `row_len` values, in
/// place, sending only the rows that are not all zero: every rank's touched
/// row indices are all-gathered, then, unless they add up to more rows than
/// the table (then it goes dense, on every rank alike), the rows themselves,
/// summed in rank order and finished as a dense reduction is (averaged,
/// post-scaled), so on one host the result is the dense all-reduce's bit for
/// bit. The rows travel as `f32`. Every rank must call it with the same name, table shape
/// and options; the ops are those of [`Collective::all_gather`] (named
/// `"{name}.rows"` and `"{name}.values"`) and, for a dense table,
/// [`Collective::all_reduce`] (named `name`).
///
/// # Errors
/// [`CommError::Invalid`] for a table that is not whole rows or an op other
/// than sum and average (a row another rank left out counts as zeros, which
/// only those two treat as nothing); a peer's out-of-range row index names
/// the peer. The collectives' own errors pass through.
pub fn all_reduce_rows<C: Collective + ?Sized>(
    comm: &C,
    name: &str,
    data: &mut [f32],
    row_len: usize,
    opts: ReduceOptions,
) -> Result<RowsSent, CommError> {
    let invalid = |message: String| CommError::Invalid { op: format!("all_reduce_rows {name:?}"), message };
    if row_len == 0 || !data.len().is_multiple_of(row_len) {
        return Err(invalid(format!("{} values are not whole rows of {row_len}", data.len())));
    }
    if !matches!(opts.op, ReduceOp::Sum | ReduceOp::Average) {
        return Err(invalid(format!("rows are summed or averaged, not reduced by {:?}", opts.op)));
    }
    let rows = data.len() / row_len;
    let touched: Vec<i32> = data
        .chunks_exact(row_len)
        .enumerate()
        .filter(|(_, row)| row.iter().any(|&x| x != 0.0))
        .map(|(i, _)| i32::try_from(i).map_err(|_| invalid(format!("{rows} rows are more than i32 indexes"))))
        .collect::<Result<_, _>>()?;
    let gathered = comm.all_gather(&format!("{name}.rows"), &[touched.len()], i32::tensor_ref(&touched))?;
    let counts = gathered.first_dims;
    let total: usize = counts.iter().sum();
    if total > rows {
        comm.all_reduce(name, &[data.len()], f32::tensor_mut(data), opts)?;
        return Ok(RowsSent::Dense);
    }
    let indices =
        i32::from_buffer(gathered.data).ok_or_else(|| invalid("gathered row indices are not i32".into()))?;
    let mut values: Vec<f32> = Vec::with_capacity(touched.len() * row_len);
    for &i in &touched {
        values.extend_from_slice(&data[i as usize * row_len..][..row_len]);
    }
    scale_bytes(DType::F32, opts.prescale, bytemuck::cast_slice_mut(&mut values));
    let gathered =
        comm.all_gather(&format!("{name}.values"), &[touched.len(), row_len], f32::tensor_ref(&values))?;
    let values =
        f32::from_buffer(gathered.data).ok_or_else(|| invalid("gathered rows are not f32".into()))?;
    let seen = sum_rows(data, row_len, &counts, &indices, &values)
        .map_err(|(rank, index)| invalid(format!("rank {rank} sent row {index} of a table of {rows}")))?;
    for (row, _) in data.chunks_exact_mut(row_len).zip(seen).filter(|(_, seen)| *seen) {
        finish(DType::F32, opts.op, comm.world_size(), opts.postscale, bytemuck::cast_slice_mut(row));
    }
    Ok(RowsSent::Sparse { rows: total })
}

/// Writes into `data` the sum of the ranks' rows, in rank order (the first
/// rank that sent a row copies it, the later ones add), zeros where no rank
/// sent one. `counts[r]` rows of rank `r` follow rank `r - 1`'s in `indices`
/// and `values`. Returns which rows some rank sent; a row index out of the
/// table gives `(rank, index)`.
fn sum_rows(
    data: &mut [f32],
    row_len: usize,
    counts: &[usize],
    indices: &[i32],
    values: &[f32],
) -> Result<Vec<bool>, (usize, i32)> {
    let rows = data.len() / row_len;
    let mut seen = vec![false; rows];
    data.fill(0.0);
    let mut at = 0;
    for (rank, &count) in counts.iter().enumerate() {
        for k in at..at + count {
            let index = indices[k];
            let i = usize::try_from(index).ok().filter(|&i| i < rows).ok_or((rank, index))?;
            let dst = &mut data[i * row_len..][..row_len];
            let src = &values[k * row_len..][..row_len];
            if std::mem::replace(&mut seen[i], true) {
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            } else {
                dst.copy_from_slice(src);
            }
        }
        at += count;
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalWorld;

    /// Runs `f(rank, comm)` on every rank of a local world of `n`.
    fn on_ranks<T: Send>(n: usize, f: impl Fn(usize, &LocalWorld) -> T + Sync) -> Vec<T> {
        let world = LocalWorld::new(n).unwrap();
        let f = &f;
        std::thread::scope(|s| {
            let handles: Vec<_> =
                world.iter().enumerate().map(|(r, comm)| s.spawn(move || f(r, comm))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// A table of 6 rows of 3 where rank `r` touched rows `r` and `r + 2`
    /// (rank 1 also row 5, rank 2 none but row 4 with a zero row).
    fn table(rank: usize) -> Vec<f32> {
        let mut t = vec![0.0f32; 18];
        let rows: &[usize] = match rank {
            0 => &[0, 2],
            1 => &[1, 3, 5],
            _ => &[2],
        };
        for &i in rows {
            for j in 0..3 {
                t[i * 3 + j] = 0.1 * (rank + 1) as f32 + 0.01 * (i * 3 + j) as f32;
            }
        }
        t
    }

    #[test]
    fn sparse_rows_give_the_dense_average_bit_for_bit() {
        let results = on_ranks(3, |rank, comm| {
            let mut dense = table(rank);
            comm.all_reduce("dense", &[18], f32::tensor_mut(&mut dense), ReduceOptions::average()).unwrap();
            let mut sparse = table(rank);
            let sent = all_reduce_rows(comm, "sparse", &mut sparse, 3, ReduceOptions::average()).unwrap();
            (dense, sparse, sent)
        });
        for (dense, sparse, sent) in results {
            assert_eq!(sent, RowsSent::Sparse { rows: 6 });
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sparse), bits(&dense));
            assert!(sparse[4 * 3..5 * 3].iter().all(|&x| x == 0.0), "row 4: no rank touched it");
        }
    }

    #[test]
    fn rows_that_outnumber_the_table_go_dense_on_every_rank() {
        let results = on_ranks(2, |rank, comm| {
            let mut t: Vec<f32> = (0..8).map(|i| (i + rank) as f32 + 1.0).collect();
            let sent = all_reduce_rows(comm, "full", &mut t, 2, ReduceOptions::sum().prescale(2.0)).unwrap();
            (t, sent)
        });
        for (t, sent) in results {
            assert_eq!(sent, RowsSent::Dense);
            assert_eq!(t, (0..8).map(|i| 2.0 * (2 * i + 3) as f32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_rank_with_no_rows_and_the_scales_are_honoured() {
        let results = on_ranks(2, |rank, comm| {
            let mut t = vec![0.0f32; 8];
            if rank == 1 {
                t[6] = 3.0;
                t[7] = -1.0;
            }
            let opts = ReduceOptions::sum().prescale(2.0).postscale(0.5);
            (all_reduce_rows(comm, "one", &mut t, 2, opts).unwrap(), t)
        });
        for (sent, t) in results {
            assert_eq!(sent, RowsSent::Sparse { rows: 1 });
            assert_eq!(t, vec![0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, -1.0]);
        }
    }

    #[test]
    fn bad_tables_and_ops_are_refused_by_name() {
        let comm = crate::SingleProcess;
        let err = all_reduce_rows(&comm, "emb", &mut [0.0; 5], 2, ReduceOptions::sum()).unwrap_err();
        assert!(err.to_string().contains("\"emb\": 5 values are not whole rows of 2"), "{err}");
        let max = ReduceOptions::new(ReduceOp::Max);
        let err = all_reduce_rows(&comm, "emb", &mut [0.0; 4], 2, max).unwrap_err();
        assert!(err.to_string().contains("not reduced by Max"), "{err}");
        assert_eq!(sum_rows(&mut [0.0; 4], 2, &[1, 1], &[0, 2], &[1.0; 4]), Err((1, 2)));
        assert_eq!(sum_rows(&mut [0.0; 4], 2, &[1, 1], &[1, 1], &[1.0; 4]), Ok(vec![false, true]));
    }
}

//! Host-device transfers, counted where drove makes them: blocking reads (the
//! host waits until the device has computed a value and copied it back) and
//! uploads (host values copied to the device).
//!
//! A GPU step's speed depends on both: a read in the middle of a step leaves
//! the device idle while the host builds what follows, and an upload of a
//! large host-made tensor costs host time and a copy. burn has no hook for
//! either, and cubecl's execution log shows launches only, so drove counts its
//! own calls here; a read or upload burn makes inside an operation is not
//! counted.

use std::ops::Sub;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, ElementConversion, Tensor, TensorData, TensorKind};

static READS: AtomicU64 = AtomicU64::new(0);
static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// Transfers counted so far in this process (or, as a difference of two
/// readings, between them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Transfers {
    /// Blocking reads: the host waited for the device.
    pub reads: u64,
    /// Uploads: host values copied to the device.
    pub uploads: u64,
}

impl Sub for Transfers {
    type Output = Transfers;
    fn sub(self, earlier: Transfers) -> Transfers {
        Transfers {
            reads: self.reads.saturating_sub(earlier.reads),
            uploads: self.uploads.saturating_sub(earlier.uploads),
        }
    }
}

/// The transfers counted so far in this process.
pub fn transfers() -> Transfers {
    Transfers { reads: READS.load(Ordering::Relaxed), uploads: UPLOADS.load(Ordering::Relaxed) }
}

/// Counts one blocking read made some other way (a read of several tensors
/// at once counts once).
pub fn count_read() {
    READS.fetch_add(1, Ordering::Relaxed);
}

/// Counts one upload made some other way.
pub fn count_upload() {
    UPLOADS.fetch_add(1, Ordering::Relaxed);
}

/// Reads `tensor`'s values back to the host (burn's `into_data`), counted.
pub fn read<B: Backend, const D: usize, K: TensorKind<B> + BasicOps<B>>(
    tensor: Tensor<B, D, K>,
) -> TensorData {
    count_read();
    tensor.into_data()
}

/// Reads a one-element float tensor back to the host as an `f64`, counted.
pub fn read_scalar<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> f64 {
    count_read();
    f64::from(tensor.into_scalar().elem::<f32>())
}

/// Makes a tensor of `data` on `device` (burn's `from_data`), counted.
pub fn upload<B: Backend, const D: usize, K: TensorKind<B> + BasicOps<B>>(
    data: TensorData,
    device: &B::Device,
) -> Tensor<B, D, K> {
    count_upload();
    Tensor::from_data(data, device)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    #[test]
    fn each_wrapper_counts_once() {
        let device = Default::default();
        let before = transfers();
        let t: Tensor<Flex, 2> = upload(TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]), &device);
        let after_upload = transfers() - before;
        assert!(after_upload.uploads >= 1);
        let values = read(t.clone()).to_vec::<f32>().unwrap();
        assert_eq!(values, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(read_scalar(t.sum()), 10.0);
        let all = transfers() - before;
        // Other tests in this process may count too: at least ours.
        assert!(all.reads >= 2 && all.uploads >= 1, "{all:?}");
    }

    #[test]
    fn a_difference_never_underflows() {
        let a = Transfers { reads: 1, uploads: 5 };
        let b = Transfers { reads: 3, uploads: 2 };
        assert_eq!(a - b, Transfers { reads: 0, uploads: 3 });
    }
}

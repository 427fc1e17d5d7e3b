//! The NCCL suite: NCCL all-reduce bandwidth beside a device-to-device copy,
//! at the world size of the caller's mesh (one process per GPU); and the
//! in-place check of training's gradient path on burn tensors. The suites
//! need feature `nccl`; [`NcclOptions`] is in every build, so that a command
//! can parse its flags and say how to build a drove that runs it.

/// Settings of the NCCL suite (`drove bench nccl`, which adds `--buckets`
/// for the in-place check).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct NcclOptions {
    /// Buffer sizes in bytes (suffixes KiB, MiB, GiB).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', default_value = "64MiB,1GiB",
        value_parser = parse::size))]
    pub sizes: Vec<u64>,
    /// Timed iterations per size (after 5 untimed).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 20))]
    pub iterations: u32,
    /// GPU number.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub gpu: usize,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions { sizes: vec![64 << 20, 1 << 30], iterations: 20, gpu: 0 }
    }
}

#[cfg(feature = "clap")]
mod parse {
    pub fn size(s: &str) -> Result<u64, String> {
        let (digits, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
        let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size (like 64MiB)"))?;
        let scale = match unit {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            other => return Err(format!("unknown unit {other:?} in {s:?}: use B, KiB, MiB or GiB")),
        };
        n.checked_mul(scale)
            .filter(|&b| b >= 4)
            .ok_or_else(|| format!("{s:?} is out of range (4 bytes or more)"))
    }
}

#[cfg(feature = "nccl")]
pub use suite::{NcclReport, NcclRow, in_place, run};

#[cfg(feature = "nccl")]
mod suite {
    use drove_collective::{Collective, DType, ReduceOptions};
    use drove_device::cuda::{
        DeviceBuffer, InPlaceReport, NcclBuckets, check_in_place, copy_seconds, device_name, open_gpu,
    };
    use drove_nccl::{DeviceComm, DeviceOptions, DeviceSlice, Nccl};
    use serde::Serialize;

    use super::NcclOptions;
    use crate::error::Doing as _;
    use crate::{BenchError, median};

    /// What the NCCL suite reports (the JSON of `drove bench nccl`; keys in
    /// the order of their names, as they always were).
    #[derive(Clone, Debug, PartialEq, Serialize)]
    pub struct NcclReport {
        /// `nccl`.
        pub benchmark: &'static str,
        /// The GPU's name.
        pub device: String,
        /// Timed iterations per size.
        pub iterations: u32,
        /// What NCCL runs on (drove-nccl's description).
        pub nccl: String,
        /// What was timed, in words.
        pub note: &'static str,
        /// This rank.
        pub rank: usize,
        /// Per size, the all-reduce and the copy.
        pub sizes: Vec<NcclRow>,
        /// Ranks in the communicator.
        pub world_size: usize,
    }

    /// One buffer size's figures (keys in the order of their names).
    #[derive(Clone, Debug, PartialEq, Serialize)]
    pub struct NcclRow {
        /// Bytes over the all-reduce's median time, GB/s.
        pub allreduce_algbw_gbps: f64,
        /// nccl-tests' bus bandwidth: algbw x 2(n-1)/n, which is 0 at one
        /// rank. The time is this rank's; ranks wait for each other in every op.
        pub allreduce_busbw_gbps: f64,
        /// The all-reduce's median seconds.
        pub allreduce_median_s: f64,
        /// The all-reduce's median time over the copy's.
        pub allreduce_over_copy_time: f64,
        /// The buffer's bytes.
        pub bytes: u64,
        /// Bytes over the copy's median time, GB/s.
        pub copy_gbps: f64,
        /// The device-to-device copy's median seconds.
        pub copy_median_s: f64,
    }

    const NOTE: &str = "in-place all-reduce through drove's DeviceComm (agreement, launch, polled wait); the copy is cuMemcpyDtoD on the same stream";

    /// The in-place checks on burn tensors on GPU `o.gpu`: the gradient bucket
    /// all-reduce and an all-gather in both directions for each tensor layout,
    /// every result read back through burn and compared bit for bit.
    pub fn in_place(o: &NcclOptions, mesh: &dyn Collective) -> Result<InPlaceReport, BenchError> {
        let device = open_gpu(o.gpu).doing_with(|| format!("opening GPU {}", o.gpu))?;
        let buckets = NcclBuckets::connect(mesh, o.gpu, device, DeviceOptions::default())
            .doing("joining the NCCL communicator")?;
        Ok(check_in_place(&buckets, mesh))
    }

    /// NCCL all-reduce beside a device copy on GPU `o.gpu`, at `mesh`'s world size.
    pub fn run(o: &NcclOptions, mesh: &dyn Collective) -> Result<NcclReport, BenchError> {
        let nccl = Nccl::new(o.gpu).doing("opening NCCL")?;
        let stream = nccl.stream() as drove_device::cuda::CUstream;
        let comm = DeviceComm::connect(mesh, nccl, DeviceOptions::default())?;
        let name = device_name(o.gpu)?;
        let sizes = o
            .sizes
            .iter()
            .map(|&bytes| size_row(o, mesh, &comm, stream, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NcclReport {
            benchmark: "nccl",
            device: name,
            iterations: o.iterations,
            nccl: comm.describe(),
            note: NOTE,
            rank: mesh.rank(),
            sizes,
            world_size: mesh.world_size(),
        })
    }

    /// One size: 5 untimed rounds, then `o.iterations` of an all-reduce and a
    /// copy, interleaved so that clocks and neighbours affect both alike.
    fn size_row(
        o: &NcclOptions,
        mesh: &dyn Collective,
        comm: &DeviceComm<Nccl>,
        stream: drove_device::cuda::CUstream,
        bytes: u64,
    ) -> Result<NcclRow, BenchError> {
        let (a, b) = (DeviceBuffer::zeroed(bytes as usize)?, DeviceBuffer::new(bytes as usize)?);
        let slice = DeviceSlice { ptr: a.ptr(), len: (bytes / 4) as usize, dtype: DType::F32 };
        let time_allreduce = || -> Result<f64, BenchError> {
            let t = std::time::Instant::now();
            // SAFETY: `a` is a live allocation of `len` f32s used by nothing else.
            unsafe { comm.all_reduce(mesh, "bench", slice, ReduceOptions::sum()) }?;
            Ok(t.elapsed().as_secs_f64())
        };
        // SAFETY: the stream is NCCL's, idle between the all-reduces.
        let time_copy = || unsafe { copy_seconds(&b, &a, stream) };
        for _ in 0..5 {
            time_allreduce()?;
            time_copy()?;
        }
        let (mut ar, mut cp) = (Vec::new(), Vec::new());
        for _ in 0..o.iterations {
            ar.push(time_allreduce()?);
            cp.push(time_copy()?);
        }
        let (t_ar, t_cp) = (median(ar).unwrap_or(f64::NAN), median(cp).unwrap_or(f64::NAN));
        let world = mesh.world_size() as f64;
        let algbw = bytes as f64 / t_ar / 1e9;
        Ok(NcclRow {
            allreduce_algbw_gbps: algbw,
            allreduce_busbw_gbps: algbw * 2.0 * (world - 1.0) / world,
            allreduce_median_s: t_ar,
            allreduce_over_copy_time: t_ar / t_cp,
            bytes,
            copy_gbps: bytes as f64 / t_cp / 1e9,
            copy_median_s: t_cp,
        })
    }
}

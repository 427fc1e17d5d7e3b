//! The GPU side of the CLI: `--device cuda[:N]` for `drove train ner` and
//! `drove bench train`, `drove bench nccl`, and `drove weights` (the f16
//! packing of the GPU check). Built with features `cuda` and `nccl`; without
//! them each says how to build it, and with them a machine without a GPU gets
//! one error naming the missing library (no panic).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use drove_comm::Collective;
use drove_ner::{NerError, NerOptions, NerSummary, Observer};
use drove_train::gpu::DeviceChoice;

/// A GPU opened for training (its checks passed).
pub struct Gpu {
    #[cfg(feature = "cuda")]
    ordinal: usize,
    #[cfg(feature = "cuda")]
    device: drove_train::cuda::CudaDevice,
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

#[cfg(not(all(feature = "cuda", feature = "nccl")))]
const BUILD_HINT: &str = "this drove was built without GPU support: build it with \
     `cargo build --release -p drove-cli --features cuda,nccl` (the CUDA libraries are loaded at run time)";

/// Opens the GPU `choice` names (`cuda` alone: the one of `local_rank`, the
/// rank's place on its host, whichever launcher gave it), or `None` for the
/// CPU. Runs before the rank joins the others, so a missing GPU fails at once.
pub fn open(choice: DeviceChoice, local_rank: usize) -> anyhow::Result<Option<Gpu>> {
    let DeviceChoice::Cuda(n) = choice else { return Ok(None) };
    #[cfg(feature = "cuda")]
    {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let ordinal = drove_train::gpu::gpu_ordinal(n, local_rank, visible.as_deref());
        let device = drove_train::cuda::open_gpu(ordinal).with_context(|| format!("--device {choice}"))?;
        Ok(Some(Gpu { ordinal, device }))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (n, local_rank);
        anyhow::bail!("--device {choice}: {BUILD_HINT}")
    }
}

impl Gpu {
    /// `cuda:N`.
    pub fn name(&self) -> String {
        #[cfg(feature = "cuda")]
        return format!("cuda:{}", self.ordinal);
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }

    /// Fine-tunes on this GPU: burn-cuda, the backend placement, and (feature
    /// `nccl`, more than one rank) gradient buckets all-reduced by NCCL in
    /// place; with one rank there is nothing to reduce.
    pub fn train_ner(
        &self,
        opts: &NerOptions,
        comm: &dyn Collective,
        observer: &mut dyn Observer,
    ) -> Result<NerSummary, NerError> {
        #[cfg(feature = "cuda")]
        {
            use drove_train::cuda::Cuda;
            type Reducer = Box<dyn drove_train::device::BucketAllReduce<Cuda>>;
            #[cfg(feature = "nccl")]
            let reducer: Option<Reducer> = drove_train::cuda::gradient_reducer(
                comm,
                self.ordinal,
                self.device.clone(),
                drove_nccl::DeviceOptions::default(),
            )?
            .map(|buckets| {
                let by = buckets.describe();
                observer.note(&format!("rank {}: gradient all-reduce by {by}", comm.rank()));
                Box::new(buckets) as Reducer
            });
            #[cfg(not(feature = "nccl"))]
            let reducer: Option<Reducer> = None;
            drove_ner::train_ner_with::<burn::backend::Autodiff<Cuda>>(
                opts,
                comm,
                observer,
                &self.device,
                reducer,
            )
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (opts, comm, observer);
            match self.never {}
        }
    }

    /// Bytes of GPU memory in use on the device (all processes), from the
    /// driver, with the GPU's primary context made current for the call.
    pub fn memory_used_bytes(&self) -> Option<u64> {
        #[cfg(feature = "cuda")]
        {
            drove_train::cuda::memory_used_bytes(self.ordinal)
                .map_err(|e| tracing::warn!("GPU memory in use: {e}"))
                .ok()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}

/// Settings of `drove bench nccl`.
#[derive(Debug, Args)]
pub struct NcclBenchArgs {
    /// Buffer sizes in bytes (suffixes KiB, MiB, GiB).
    #[arg(long, value_delimiter = ',', default_value = "64MiB,1GiB", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Timed iterations per size (after 5 untimed).
    #[arg(long, default_value_t = 20)]
    iterations: u32,
    /// GPU number.
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Instead of timing, prove the in-place path of training: the gradient
    /// bucket all-reduce and an all-gather in both directions on burn tensors
    /// of each layout (own buffer, shared clone, view at an offset, piece of a
    /// split, broadcast), every result read back through burn and compared bit
    /// for bit. Exit code 1 when a check fails (after printing the report).
    #[arg(long)]
    buckets: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, ""), |i| s.split_at(i));
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size (like 64MiB)"))?;
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?} in {s:?}: use B, KiB, MiB or GiB")),
    };
    n.checked_mul(scale).filter(|&b| b >= 4).ok_or_else(|| format!("{s:?} is out of range (4 bytes or more)"))
}

/// `drove bench nccl`: NCCL all-reduce beside a device copy, at the world
/// size of the launcher it runs under (1 alone); with `--buckets`, the
/// in-place checks instead.
pub fn bench_nccl(args: &NcclBenchArgs) -> anyhow::Result<ExitCode> {
    #[cfg(feature = "nccl")]
    {
        let launch = drove_launch::LaunchEnv::from_env()?;
        let served = launch.serve_coordinator()?;
        let mesh = launch.communicator()?;
        let (report, passed) = if args.buckets {
            let report = nccl_bench::in_place(args, mesh.as_ref())?;
            let passed = report.passed;
            (serde_json::to_value(report).context("json")?, passed)
        } else {
            (nccl_bench::run(args, mesh.as_ref())?, true)
        };
        let rank = mesh.rank();
        drop(mesh);
        launch.finish(rank, None, served);
        if args.json {
            println!("{report}");
        } else {
            println!("{}", serde_json::to_string_pretty(&report).context("json")?);
        }
        Ok(if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    }
    #[cfg(not(feature = "nccl"))]
    {
        let _ = args;
        anyhow::bail!("drove bench nccl: {BUILD_HINT}")
    }
}

#[cfg(feature = "nccl")]
mod nccl_bench {
    use std::time::Instant;

    use anyhow::{Context, anyhow};
    use cudarc::driver::result as cu;
    use drove_comm::{Collective, DType, ReduceOptions};
    use drove_nccl::{DeviceComm, DeviceOptions, DeviceSlice, Nccl};
    use drove_train::cuda::{InPlaceReport, NcclBuckets, check_in_place, open_gpu};
    use serde_json::{Value, json};

    use super::NcclBenchArgs;

    /// Frees a device allocation on every path.
    struct DeviceBuffer(u64);

    impl Drop for DeviceBuffer {
        fn drop(&mut self) {
            // SAFETY: an allocation of ours, no longer used.
            let _ = unsafe { cu::free_sync(self.0) };
        }
    }

    /// The in-place checks on burn tensors on GPU `--gpu`.
    pub fn in_place(args: &NcclBenchArgs, mesh: &dyn Collective) -> anyhow::Result<InPlaceReport> {
        let device = open_gpu(args.gpu).with_context(|| format!("opening GPU {}", args.gpu))?;
        let buckets = NcclBuckets::connect(mesh, args.gpu, device, DeviceOptions::default())
            .context("joining the NCCL communicator")?;
        Ok(check_in_place(&buckets, mesh))
    }

    pub fn run(args: &NcclBenchArgs, mesh: &dyn Collective) -> anyhow::Result<Value> {
        let nccl = Nccl::new(args.gpu).context("opening NCCL")?;
        let stream = nccl.stream() as cudarc::driver::sys::CUstream;
        let comm = DeviceComm::connect(mesh, nccl, DeviceOptions::default()).map_err(|e| anyhow!("{e}"))?;
        let world = mesh.world_size();
        let dev = cu::device::get(args.gpu as i32).map_err(|e| anyhow!("cuDeviceGet: {e:?}"))?;
        let name = cu::device::get_name(dev).map_err(|e| anyhow!("cuDeviceGetName: {e:?}"))?;
        let mut rows = Vec::new();
        for &bytes in &args.sizes {
            let count = (bytes / 4) as usize;
            // SAFETY: fresh allocations of `bytes`, zeroed, freed by the guards.
            let (a, b) = unsafe {
                let a =
                    DeviceBuffer(cu::malloc_sync(bytes as usize).map_err(|e| anyhow!("cuMemAlloc: {e:?}"))?);
                let b =
                    DeviceBuffer(cu::malloc_sync(bytes as usize).map_err(|e| anyhow!("cuMemAlloc: {e:?}"))?);
                cu::memset_d8_sync(a.0, 0, bytes as usize).map_err(|e| anyhow!("cuMemsetD8: {e:?}"))?;
                (a, b)
            };
            let slice = DeviceSlice { ptr: a.0, len: count, dtype: DType::F32 };
            let time_allreduce = || -> anyhow::Result<f64> {
                let t = Instant::now();
                // SAFETY: `a` is a live allocation of `count` f32s used by nothing else.
                unsafe { comm.all_reduce(mesh, "bench", slice, ReduceOptions::sum()) }
                    .map_err(|e| anyhow!("{e}"))?;
                Ok(t.elapsed().as_secs_f64())
            };
            let time_copy = || -> anyhow::Result<f64> {
                let t = Instant::now();
                // SAFETY: both allocations hold `bytes`; the stream is NCCL's, idle.
                unsafe {
                    cu::memcpy_dtod_async(b.0, a.0, bytes as usize, stream)
                        .map_err(|e| anyhow!("cuMemcpyDtoDAsync: {e:?}"))?;
                    cu::stream::synchronize(stream).map_err(|e| anyhow!("cuStreamSynchronize: {e:?}"))?;
                }
                Ok(t.elapsed().as_secs_f64())
            };
            for _ in 0..5 {
                time_allreduce()?;
                time_copy()?;
            }
            // Interleaved, so that clocks and neighbours affect both alike.
            let (mut ar, mut cp) = (Vec::new(), Vec::new());
            for _ in 0..args.iterations {
                ar.push(time_allreduce()?);
                cp.push(time_copy()?);
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let (t_ar, t_cp) = (median(&mut ar), median(&mut cp));
            let world = world as f64;
            let algbw = bytes as f64 / t_ar / 1e9;
            rows.push(json!({
                "bytes": bytes,
                "allreduce_median_s": t_ar,
                "allreduce_algbw_gbps": algbw,
                // nccl-tests' bus bandwidth: algbw x 2(n-1)/n, which is 0 at one rank.
                // The time is this rank's; ranks wait for each other in every op.
                "allreduce_busbw_gbps": algbw * 2.0 * (world - 1.0) / world,
                "copy_median_s": t_cp,
                "copy_gbps": bytes as f64 / t_cp / 1e9,
                "allreduce_over_copy_time": t_ar / t_cp,
            }));
        }
        Ok(json!({
            "benchmark": "nccl",
            "device": name,
            "nccl": comm.describe(),
            "rank": mesh.rank(),
            "world_size": world,
            "iterations": args.iterations,
            "note": "in-place all-reduce through drove's DeviceComm (agreement, launch, polled wait); the copy is cuMemcpyDtoD on the same stream",
            "sizes": rows,
        }))
    }
}

/// Settings of `drove weights`.
#[derive(Debug, Args)]
pub struct WeightsArgs {
    /// The safetensors file to read.
    input: PathBuf,
    /// The safetensors file to write.
    output: PathBuf,
    /// The float type every float tensor is written as: f16 (half the bytes,
    /// for carrying) or f32 (to train from).
    #[arg(long, value_parser = ["f16", "f32"])]
    to: String,
}

/// `drove weights`: rewrites a safetensors file's f32 and f16 tensors as `--to`;
/// other tensors (integer ids, for one) are copied as they are.
pub fn weights(args: &WeightsArgs) -> anyhow::Result<()> {
    use safetensors::{Dtype, SafeTensors, tensor::TensorView};
    let bytes = std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("parsing {}", args.input.display()))?;
    let to = if args.to == "f16" { Dtype::F16 } else { Dtype::F32 };
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let data = view.data();
        let converted = match (view.dtype(), to) {
            (Dtype::F32, Dtype::F16) => data
                .chunks_exact(4)
                .flat_map(|c| half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
                .collect(),
            (Dtype::F16, Dtype::F32) => data
                .chunks_exact(2)
                .flat_map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes())
                .collect(),
            // Already the type asked for, or not a float (ids, masks): as it is.
            _ => data.to_vec(),
        };
        let dtype = if matches!(view.dtype(), Dtype::F32 | Dtype::F16) { to } else { view.dtype() };
        out.push((name, dtype, view.shape().to_vec(), converted));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let views: Vec<(String, TensorView<'_>)> = out
        .iter()
        .map(|(n, d, s, b)| TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<Result<_, _>>()
        .context("building the tensors")?;
    safetensors::serialize_to_file(views, None, &args.output)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("weights: {} tensors written as {} to {}", out.len(), args.to, args.output.display());
    Ok(())
}

//! Tensors packed into one buffer on a wgpu adapter (lavapipe here): the
//! buffer is burn's `cat` bit for bit, through burn's unfused and fused wgpu
//! backends (the CUDA build is fused), and a group of parts is one launch,
//! counted from cubecl's execution log.
#![cfg(feature = "wgpu")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use drove_kernels::backends::{Wgpu, WgpuDevice, WgpuFused};
use drove_kernels::pack::{MAX_GROUP, concat};

use common::{bits, values};

/// The sizes of the parts of each case: one part; two; three of 1 element,
/// an odd size and a large one; 40 and 104 (MiniLM's parameter count) of
/// sizes from 1 to a few thousand, odd and even, with one large part.
fn cases() -> Vec<Vec<usize>> {
    let varied = |n: usize| -> Vec<usize> {
        (0..n)
            .map(|i| match i % 7 {
                0 => 1,
                1 => 2 * i + 1,
                2 => 384,
                3 => 3 * i + 2,
                4 => 1536 + i,
                5 => 7,
                _ => 1025,
            })
            .collect()
    };
    let mut forty = varied(40);
    forty[17] = 300_007;
    let mut many = varied(104);
    many[0] = 1_000_003;
    vec![vec![5], vec![3, 4], vec![1, 1031, 262_147], forty, many]
}

/// Part `p`'s values: distinct across every part of a case (so a part out
/// of place, or an element, shows), of either sign, with a -0.0 at its end.
fn part_values(p: usize, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> =
        (0..n).map(|j| (p * 1_000_003 + j) as f32 * if j % 2 == 0 { 0.5 } else { -0.25 }).collect();
    if n > 1 {
        v[n - 1] = -0.0;
    }
    v
}

fn parts<B: Backend>(sizes: &[usize], device: &B::Device) -> Vec<Tensor<B, 1>> {
    let parts = sizes.iter().enumerate();
    parts.map(|(p, &n)| Tensor::from_data(TensorData::new(part_values(p, n), [n]), device)).collect()
}

/// The parts end to end, on the host.
fn host(sizes: &[usize]) -> Vec<f32> {
    sizes.iter().enumerate().flat_map(|(p, &n)| part_values(p, n)).collect()
}

/// `concat` against `Tensor::cat` and the host's concatenation, bit for bit,
/// for every case on backend `B`.
fn packs_as_cat<B: Backend>(device: &B::Device) {
    for sizes in cases() {
        let ours = values(concat(parts::<B>(&sizes, device)));
        let cat = values(Tensor::cat(parts::<B>(&sizes, device), 0));
        assert_eq!(ours.len(), sizes.iter().sum::<usize>(), "{} parts", sizes.len());
        assert_eq!(bits(&ours), bits(&cat), "{} parts: not cat's bits", sizes.len());
        assert_eq!(bits(&ours), bits(&host(&sizes)), "{} parts: not the host's", sizes.len());
    }
}

/// Parts that are views: a slice inside a larger buffer (an offset binding)
/// and an empty part, which takes no place, among ordinary ones.
fn packs_views<B: Backend>(device: &B::Device) {
    let big = Tensor::<B, 1>::from_data(TensorData::new(part_values(9, 100), [100]), device);
    let empty = Tensor::<B, 1>::from_data(TensorData::new(Vec::<f32>::new(), [0]), device);
    let mut given = parts::<B>(&[3, 17], device);
    given.insert(1, big.slice(37..61));
    given.insert(2, empty);
    let ours = values(concat(given.clone()));
    let cat = values(Tensor::cat(given, 0));
    assert_eq!(ours.len(), 3 + 24 + 17);
    assert_eq!(bits(&ours), bits(&cat));
}

#[test]
fn the_unfused_backend_packs_as_cat() {
    let Some(device) = device() else { return };
    let _one = one_at_a_time();
    packs_as_cat::<Wgpu>(&device);
    packs_views::<Wgpu>(&device);
}

#[test]
fn the_fused_backend_packs_as_cat() {
    let Some(device) = device() else { return };
    let _one = one_at_a_time();
    packs_as_cat::<WgpuFused>(&device);
    packs_views::<WgpuFused>(&device);
}

#[test]
fn autodiff_packs_the_inner_values() {
    let Some(device) = device() else { return };
    let _one = one_at_a_time();
    packs_as_cat::<Autodiff<Wgpu>>(&device);
    packs_as_cat::<Autodiff<WgpuFused>>(&device);
}

#[test]
fn the_cpu_packs_with_cat() {
    packs_as_cat::<Flex>(&Default::default());
    packs_views::<Flex>(&Default::default());
}

#[test]
fn one_part_is_itself() {
    let Some(device) = device() else { return };
    let _one = one_at_a_time();
    let part = parts::<Wgpu>(&[6], &device).remove(0);
    let expected = values(part.clone());
    let mut got = Vec::new();
    let (launched, _) = launches(|| got = values(concat(vec![part])));
    assert_eq!(launched, 0, "one part is no copy");
    assert_eq!(bits(&got), bits(&expected));
}

/// A group of parts is one launch on either backend; `cat`'s launches, one
/// a part, are printed beside them.
#[test]
fn a_group_of_parts_is_one_launch() {
    let Some(device) = device() else { return };
    let _one = one_at_a_time();
    let group = group(&device);
    eprintln!("{group} parts a launch on this adapter");
    for sizes in cases().into_iter().filter(|s| s.len() > 1) {
        let groups = sizes.len().div_ceil(group);
        let (total, packs) = launches(|| drop(values(concat(parts::<Wgpu>(&sizes, &device)))));
        assert_eq!((total, packs), (groups, groups), "unfused, {} parts: launches (all, packs)", sizes.len());
        let (_, packs) = launches(|| drop(values(concat(parts::<WgpuFused>(&sizes, &device)))));
        assert_eq!(packs, groups, "fused, {} parts: pack launches", sizes.len());
        let (cat, _) = launches(|| drop(values(Tensor::cat(parts::<Wgpu>(&sizes, &device), 0))));
        eprintln!("{} parts: {groups} launches packed, {cat} by cat", sizes.len());
    }
}

/// The kernel is compiled once for a number of parts: other sizes and
/// places are run-time values.
#[test]
fn new_sizes_compile_nothing() {
    let Some(device) = device() else { return };
    let _one = one_at_a_time();
    let pack = |sizes: &[usize]| drop(values(concat(parts::<Wgpu>(sizes, &device))));
    let first = new_lines(&log_file(Log::Compiles), || pack(&[3, 5, 11, 2]));
    let again = new_lines(&log_file(Log::Compiles), || pack(&[1000, 1, 33, 4097]));
    let named = |lines: &[String]| lines.iter().filter(|l| l.contains("Pack")).count();
    assert!(named(&first) <= 1, "{first:?}");
    assert_eq!(named(&again), 0, "compiled again for new sizes: {again:?}");
}

/// The parts one launch takes on this adapter: [`MAX_GROUP`], or fewer where
/// the adapter binds fewer buffers (cubecl's `max_bindings`, less the output
/// and the metadata; 31 on lavapipe, so 29 parts).
fn group(device: &WgpuDevice) -> usize {
    use cubecl::Runtime;
    let client = cubecl::wgpu::WgpuRuntime::client(device);
    let max_bindings = client.properties().hardware.max_bindings;
    (max_bindings.saturating_sub(2) as usize).clamp(1, MAX_GROUP)
}

/// The adapter, with cubecl's execution and compilation logs sent to files
/// ([`log_file`]; set before any test opens the device: the configuration is
/// read once a process).
fn device() -> Option<WgpuDevice> {
    static CONFIGURED: OnceLock<()> = OnceLock::new();
    let device = common::device_or_skip()?;
    CONFIGURED.get_or_init(|| {
        use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig, compilation, profiling};
        let mut storage = CubeClRuntimeConfig::storage().lock();
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        config.profiling.logger.level = profiling::ProfilingLogLevel::Minimal;
        config.profiling.logger.file = Some(log_file(Log::Launches));
        config.profiling.logger.append = false;
        config.compilation.logger.level = compilation::CompilationLogLevel::Basic;
        config.compilation.logger.file = Some(log_file(Log::Compiles));
        config.compilation.logger.append = false;
        *storage = Some(std::sync::Arc::new(config));
    });
    Some(device)
}

/// cubecl's logs.
enum Log {
    /// `Executing <kernel>`, a line a launch.
    Launches,
    /// `[Compiling kernel] <kernel>`, a line a compile.
    Compiles,
}

fn log_file(log: Log) -> PathBuf {
    let name = match log {
        Log::Launches => "launches",
        Log::Compiles => "compiles",
    };
    std::env::temp_dir().join(format!("drove-pack-{name}-{}.log", std::process::id()))
}

/// The tests of this file one at a time, so that what the logs show is the
/// running test's own.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The kernels `run` launched (it reads its results, so that they have
/// run): all of them, and drove's pack kernel's.
fn launches(run: impl FnOnce()) -> (usize, usize) {
    let new = new_lines(&log_file(Log::Launches), run);
    let new: Vec<&String> = new.iter().filter(|l| l.starts_with("Executing")).collect();
    (new.len(), new.iter().filter(|l| l.starts_with("Executing Pack ")).count())
}

/// The lines `run` added to the log `file`. cubecl writes its logs from a
/// thread of its own: the file is read until it stops growing.
fn new_lines(file: &Path, run: impl FnOnce()) -> Vec<String> {
    let before = settled(file).lines().count();
    run();
    settled(file).lines().skip(before).map(str::to_owned).collect()
}

/// The file once it has not changed for 300 ms.
fn settled(file: &Path) -> String {
    let read = || std::fs::read_to_string(file).unwrap_or_default();
    let mut last = read();
    let mut since = Instant::now();
    let start = Instant::now();
    while since.elapsed() < Duration::from_millis(300) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
        let now = read();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

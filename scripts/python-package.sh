#!/usr/bin/env bash
# The Python package (python/): one wheel built by maturin (PyO3, the stable
# ABI: abi3 for Python 3.9+), installed into a fresh virtual environment of the
# oldest and of the newest Python this machine has (pyenv's, else whichever
# python3.X is on PATH, else python3), and its tests run there against the Rust
# side: `drove seed` (DROVE_BIN, default target/debug/drove) and the masks of
# drove-collate's `mask_fixture` example.
#
#   bash scripts/python-package.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
drove_bin="${DROVE_BIN:-$root/target/debug/drove}"
if [ ! -x "$drove_bin" ]; then
    echo "python-package: $drove_bin not found: build it first (cargo build -p drove-cli) or set DROVE_BIN" >&2
    exit 1
fi
build_venv="$root/target/python-build-venv"
[ -x "$build_venv/bin/pip" ] || python3 -m venv "$build_venv"
# A no-op when the pinned maturin is there; a changed pin is installed.
"$build_venv/bin/pip" install -q -r "$root/python/requirements-build.txt"
wheels="$root/target/wheels"
rm -f "$wheels"/drove-*.whl
(cd "$root/python" && CARGO_TARGET_DIR="$root/target/python" \
    "$build_venv/bin/maturin" build --release --locked --quiet -o "$wheels")
wheel="$(ls "$wheels"/drove-*-abi3-*.whl)"
echo "python-package: built $(basename "$wheel")"
# The masks the Rust masker makes, for the Python masker to match bit for bit.
fixture="$root/target/python-mask-fixture.json"
(cd "$root" && cargo run --quiet --locked -p drove-collate --example mask_fixture >"$fixture")

# The interpreters: every python3.X (X >= 9) found, keeping the oldest and newest.
found=()
for minor in 9 10 11 12 13 14; do
    for candidate in "$HOME"/.pyenv/versions/3."$minor".*/bin/python3."$minor" "$(command -v python3."$minor" || true)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            found+=("$candidate")
            break
        fi
    done
done
[ ${#found[@]} -gt 0 ] || found=("$(command -v python3)")
pythons=("${found[0]}")
[ ${#found[@]} -gt 1 ] && pythons+=("${found[-1]}")
for python in "${pythons[@]}"; do
    version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    venv="$root/target/python-test-venv-$version"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install -q -r "$root/python/requirements-test.txt"
    "$venv/bin/pip" install -q --no-deps "$wheel"
    echo "python-package: the tests on Python $version ($python)"
    # From outside the source tree, so that the installed package is the one imported.
    (cd "$venv" && DROVE_BIN="$drove_bin" DROVE_MASK_FIXTURE="$fixture" "$venv/bin/python" -m unittest discover -s "$root/python/tests")
done

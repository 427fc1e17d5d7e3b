#!/usr/bin/env bash
# The Python package (python/): one wheel built by maturin (PyO3, the stable
# ABI: abi3 for Python 3.9+), installed into a fresh virtual environment of the
# oldest and of the newest Python this machine has (pyenv's, else whichever
# python3.X is on PATH, else python3), and its tests run there against the Rust
# side: `drove seed` (DROVE_BIN, default target/debug/drove) and the masks and
# sampler orders of drove-collate's `mask_fixture` example. Then once more on
# the Python that has a real PyTorch (scripts/torch-tools.sh: Debian's
# python3-torch, as root on Debian), where the torch tests run: worker
# seeding, the sampler, the diagnostic, and PyTorch programs under `drove run
# --np 4`; elsewhere they skip, saying why.
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
# The tests' wheel is built unoptimised (overflow checks on, and about half
# the build time of a release build on 2 cores); `pip install ./python`
# builds the release one users get (DROVE_PYTHON_PROFILE=release here too).
profile="${DROVE_PYTHON_PROFILE:-dev}"
wheels="$root/target/wheels-$profile"
rm -f "$wheels"/drove-*.whl
(cd "$root/python" && CARGO_TARGET_DIR="$root/target/python" \
    "$build_venv/bin/maturin" build --profile "$profile" --locked --quiet -o "$wheels")
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

torch_python="$(bash "$root/scripts/torch-tools.sh")"
if [ -n "$torch_python" ]; then
    venv="$root/target/python-torch-venv"
    rm -rf "$venv"
    # Debian's torch and NumPy come from the system's site-packages.
    "$torch_python" -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install -q --no-deps "$wheel"
    echo "python-package: the torch tests on $("$venv/bin/python" -c 'import torch, sys; print("Python %d.%d, torch %s" % (sys.version_info[:2] + (torch.__version__,)))')"
    # DROVE_REQUIRE_TORCH: here a torch that does not import fails the tests.
    # Only the tests that need torch: the others ran on the oldest and newest
    # Python above.
    for tests in test_torch.py test_launch.py test_watch.py; do
        (cd "$venv" && DROVE_BIN="$drove_bin" DROVE_MASK_FIXTURE="$fixture" DROVE_REQUIRE_TORCH=1 \
            "$venv/bin/python" -m unittest discover -s "$root/python/tests" -p "$tests")
    done
elif [ "${DROVE_REQUIRE_TOOLS:-}" = 1 ]; then
    echo "python-package: DROVE_REQUIRE_TOOLS=1 and no Python with torch here (scripts/torch-tools.sh said why): the torch tests cannot run" >&2
    exit 1
else
    echo "python-package: no Python with torch here (scripts/torch-tools.sh said why): the torch tests skipped"
fi

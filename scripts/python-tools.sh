#!/usr/bin/env bash
# The Python tools the tests drive, from PyPI, in a virtual environment of their
# own: target/tools-venv (scripts/python-tools.txt lists them). Run again with
# the same list, it does nothing. Prints the environment's python on stdout.
# Two callers at once (two tests of one binary) take turns: the second finds
# the first one's environment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/tools-venv"
mkdir -p "$root/target"
exec 9>"$root/target/tools-venv.lock"
flock 9
list="$root/scripts/python-tools.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$list" | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "$venv/bin/python"
    exit 0
fi
python=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    echo "python-tools: no python with venv found; installing python3-venv from Debian" >&2
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq >&2
    $sudo apt-get install -y -qq python3 python3-venv >/dev/null
    python=python3
fi
rm -rf "$venv"
"$python" -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$list" >&2
echo "$want" > "$stamp"
echo "$venv/bin/python"

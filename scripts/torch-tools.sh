#!/usr/bin/env bash
# A real PyTorch for the Python package's torch tests: Debian 12's
# python3-torch (1.13.1, CPU; DataLoader, gloo, torch.distributed.run) for
# Debian's python3.11. PyPI's torch wheel pulls about 3 GB of CUDA libraries,
# so CI never installs it (the masking benchmark may, in a venv of its own).
#
#   bash scripts/torch-tools.sh     # prints the Python that imports torch, or nothing
#
# Installs python3-torch as root on Debian when missing; elsewhere it says why
# on stderr, prints nothing, and the torch tests skip with that reason.
# Idempotent.
set -euo pipefail

say() { echo "torch-tools: $*" >&2; }

python=/usr/bin/python3
if [ -x "$python" ] && "$python" -c 'import torch' 2>/dev/null; then
    echo "$python"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "not root and Debian's python3-torch missing: the torch tests will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    say "no apt-get (not Debian): the torch tests will skip"
    exit 0
fi
say "installing python3-torch and python3-venv from the Debian archive"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2 || say "apt-get update failed; trying the cached lists"
if ! apt-get install -y -qq --no-install-recommends python3-torch python3-venv >&2; then
    say "could not install python3-torch: the torch tests will skip"
    exit 0
fi
if "$python" -c 'import torch' 2>/dev/null; then
    echo "$python"
else
    say "python3-torch installed but $python cannot import torch: the torch tests will skip"
fi

#!/usr/bin/env bash
# HuggingFace's MLM collator under transformers.set_seed(42) on 4 ranks (real
# processes), its masks compared by drove's diagnostic: prints one JSON object
# (agreement 1.0 is the story's bug). Makes its own venv (target/bench-python-venv)
# from bench/python-requirements.txt, installs the wheel scripts/python-package.sh
# built (--no-deps), fetches the assets if missing. Not part of CI.
#
#   bash bench/hf_collator.sh [--ranks 4] [--batch 32] [--seq 64]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=target/bench-python-venv
wheel="$(ls -t target/wheels*/drove-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ]; then
    echo "hf_collator: no target/wheels*/drove-*.whl; build it with bash scripts/python-package.sh" >&2
    exit 1
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r bench/python-requirements.txt
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"
assets="${DROVE_ASSETS:-assets}"
if [ ! -f "$assets/minilm/vocab.txt" ] || [ ! -f "$assets/conll2003/train.txt" ]; then
    bash scripts/fetch-assets.sh >&2
fi
export TRANSFORMERS_NO_ADVISORY_WARNINGS=1
exec "$venv/bin/python" bench/hf_collator.py --assets "$assets" "$@"

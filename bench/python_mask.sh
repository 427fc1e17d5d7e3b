#!/usr/bin/env bash
# Masking tokens/s through the drove Python package beside HuggingFace's
# DataCollatorForLanguageModeling (return_tensors="np", no torch) and the story's
# random.random() loop, interleaved in one run; prints one JSON object (medians and
# ratios). Makes its own venv (target/bench-python-venv) from
# bench/python-requirements.txt, installs the wheel that scripts/python-package.sh
# built (target/wheels*/drove-*.whl, with --no-deps), fetches the assets if missing
# (the MiniLM vocabulary, for the collator's tokenizer), then runs
# bench/python_mask.py with the arguments given. Not part of CI.
#
#   bash bench/python_mask.sh [--batch 32] [--seq 128] [--rounds 5] [--batches-per-round 20] [--min-seconds 0.5]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=target/bench-python-venv
wheel="$(ls -t target/wheels*/drove-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ]; then
    echo "python_mask: no target/wheels*/drove-*.whl; build it with bash scripts/python-package.sh" >&2
    exit 1
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r bench/python-requirements.txt
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$wheel"
assets="${DROVE_ASSETS:-assets}"
if [ ! -f "$assets/minilm/vocab.txt" ] && [ ! -f "$assets/minilm/tokenizer.json" ]; then
    bash scripts/fetch-assets.sh >&2
fi
export TRANSFORMERS_NO_ADVISORY_WARNINGS=1
exec "$venv/bin/python" bench/python_mask.py "$@"

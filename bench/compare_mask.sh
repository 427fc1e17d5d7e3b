#!/usr/bin/env bash
# Masking throughput of drove against a NumPy baseline, interleaved in one run
# (3 rounds each) so machine noise hits both; prints one JSON object with medians
# and ratios. Needs numpy for the baseline.
#
#   bash bench/compare_mask.sh [BATCH] [SEQ]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
batch="${1:-32}"
seq="${2:-128}"
cargo build --release --locked -q -p drove-cli
python3 -c "import numpy" 2>/dev/null || python3 -m pip install --quiet numpy
out="$(mktemp)"
for _ in 1 2 3; do
    ./target/release/drove bench mask --batch "$batch" --seq "$seq" --workers 2 --json >>"$out"
    echo >>"$out"
    python3 bench/numpy_mask.py --batch "$batch" --seq "$seq" >>"$out"
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
drove = [r for r in rows if "masker_tokens_per_s" in r]
numpy = [r for r in rows if "baseline" in r]
med = lambda xs: statistics.median(xs)
m = med([r["masker_tokens_per_s"] for r in drove])
c = med([r["collate_tokens_per_s"] for r in drove])
l = med([r["loader_tokens_per_s"] for r in drove])
rng = med([r["baseline_rng_u64_per_s"] for r in drove])
n = med([r["tokens_per_s"] for r in numpy])
print(json.dumps({
    "batch": drove[0]["batch"], "seq": drove[0]["seq"], "machine": drove[0]["machine"],
    "masker_tokens_per_s": m, "collate_tokens_per_s": c, "loader_2_workers_tokens_per_s": l,
    "numpy_mask_tokens_per_s": n, "pcg64_u64_per_s": rng,
    "masker_vs_numpy": m / n, "collate_vs_numpy": c / n, "masker_vs_pcg64_draws": m / rng,
}, indent=1))
PY
rm -f "$out"

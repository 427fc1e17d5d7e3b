#!/usr/bin/env bash
# The zoo under `drove run --np 4`, each form unfixed and fixed, unchanged:
# one JSON line a run (the form, whether fixed, the watcher's alarms, the
# masks' mean agreement against independent masks', its warnings), for
# BENCHMARKS.md's table.
#
#   PYTHON=/path/to/python DROVE=target/debug/drove bash bench/zoo/run.sh [form.py ...]
#
# PYTHON needs torch and the drove package (the fixes use drove.torch); the
# HuggingFace, Accelerate and Lightning forms need those packages
# (bench/zoo/requirements.txt).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
drove="${DROVE:-$here/../../target/debug/drove}"
forms=("$@")
[ ${#forms[@]} -gt 0 ] || forms=(story.py numpy_worker_init.py torch_manual_seed.py hf_set_seed.py
    hf_collator_seed.py accelerate_set_seed.py lightning_seed_everything.py correct.py)
for form in "${forms[@]}"; do
    for fix in "" --fix; do
        [ "$form" = correct.py ] && [ -n "$fix" ] && continue
        fixed=false
        [ -n "$fix" ] && fixed=true
        log="$(mktemp)"
        DROVE_WATCH_EVERY=3 "$drove" run --np 4 -- "$python" "$here/$form" --epochs 2 --batches 12 $fix >"$log" 2>&1 \
            || { echo "{\"form\": \"$form\", \"fixed\": $fixed, \"failed\": true}"; tail -5 "$log" >&2; continue; }
        FORM="$form" FIXED="$fixed" python3 - "$log" <<'PY'
import json, os, re, sys
text = open(sys.argv[1]).read()
lines = [l[len("[0] drove-watch: "):] for l in text.splitlines() if l.startswith("[0] drove-watch: ")]
summary = next((l for l in lines if "mean agreement" in l or "no batch" in l), "")
m = re.search(r"mean agreement ([0-9.]+) against ([0-9.]+) for independent masks, (\d+) beyond", summary)
print(json.dumps({
    "form": os.environ["FORM"], "fixed": os.environ["FIXED"] == "true",
    "alarms": [l[len("diversity alarm: "):] for l in lines if l.startswith("diversity alarm: ")],
    "agreement": float(m.group(1)) if m else None, "expected": float(m.group(2)) if m else None,
    "beyond_band": int(m.group(3)) if m else None,
    "warnings": [l[len("warning: "):] for l in lines if l.startswith("warning: ")],
}))
PY
        rm -f "$log"
    done
done

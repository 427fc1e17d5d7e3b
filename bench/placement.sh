#!/usr/bin/env bash
# Training throughput of the two placements of drove_train::Replica beside the
# build of an earlier commit (each placement beside the same one there, or the
# loop before Replica for a commit without placements), interleaved so that the
# machine's noise falls on all three alike; prints one JSON object with every
# run and the medians.
#
#   bash bench/placement.sh BASELINE_COMMIT [ROUNDS] [STEPS]   (default 3 rounds of 60 steps)
#
# The baseline is built from a worktree of BASELINE_COMMIT into this target
# folder (dependencies shared: only the drove crates build twice), its binary
# copied to target/bench-baseline/drove.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=${1:?usage: bench/placement.sh BASELINE_COMMIT [ROUNDS] [STEPS]}
rounds=${2:-3}
steps=${3:-60}
bash scripts/fetch-assets.sh >/dev/null
cargo build --release --locked -p drove-cli
mkdir -p target/bench-baseline
if [ ! -x target/bench-baseline/drove ] || [ "$(cat target/bench-baseline/commit 2>/dev/null)" != "$base" ]; then
    tree=$(mktemp -d)
    git worktree add --detach "$tree" "$base" >/dev/null
    (cd "$tree" && CARGO_TARGET_DIR="$OLDPWD/target" cargo build --release --locked -p drove-cli)
    cp target/release/drove target/bench-baseline/drove
    echo "$base" > target/bench-baseline/commit
    git worktree remove --force "$tree"
    cargo build --release --locked -p drove-cli
fi
args=(bench train --data assets/conll2003 --model assets/minilm --steps "$steps" --json)
# A baseline that has --placement runs in both placements, each compared with
# the same placement here; an older one runs its only loop.
if target/bench-baseline/drove bench train --help | grep -q -- '--placement'; then
    kinds=(baseline-host host baseline-backend backend)
else
    kinds=(baseline host backend)
fi
runs=()
for round in $(seq "$rounds"); do
    for which in "${kinds[@]}"; do
        case $which in
            baseline) line=$(target/bench-baseline/drove "${args[@]}") ;;
            baseline-host) line=$(target/bench-baseline/drove "${args[@]}" --placement host) ;;
            baseline-backend) line=$(target/bench-baseline/drove "${args[@]}" --placement backend) ;;
            host) line=$(target/release/drove "${args[@]}" --placement host) ;;
            backend) line=$(target/release/drove "${args[@]}" --placement backend) ;;
        esac
        echo "round $round $which: $line" >&2
        runs+=("{\"round\": $round, \"which\": \"$which\", \"report\": $line}")
    done
done
printf '%s\n' "${runs[@]}" | python3 -c '
import json, statistics, sys
runs = [json.loads(l) for l in sys.stdin]
kinds = sorted({r["which"] for r in runs})
med = {w: statistics.median(r["report"]["sentences_per_s"] for r in runs if r["which"] == w) for w in kinds}
rss = {w: max(r["report"]["peak_rss_bytes"] for r in runs if r["which"] == w) for w in kinds}
base = lambda p: med.get("baseline-" + p, med.get("baseline"))
print(json.dumps({"benchmark": "placement", "baseline_commit": sys.argv[1],
                  "median_sentences_per_s": med,
                  "host_vs_baseline": med["host"] / base("host"),
                  "backend_vs_baseline": med["backend"] / base("backend"),
                  "peak_rss_bytes": rss, "runs": runs}))' "$base"

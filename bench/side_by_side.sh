#!/usr/bin/env bash
# Two drove binaries side by side on one host, interleaved round by round so
# the machine's noise falls on both alike: the shared-memory all-reduce
# (`drove bench allreduce --np 2`, 1 KiB and 64 MiB) and a short run of the
# main job's training (4 ranks under `drove run`, MiniLM-L6, batch 8, no
# evaluation). Prints one JSON object with every run and the medians.
#
#   bash bench/side_by_side.sh BASELINE_BIN NEW_BIN [ROUNDS] [SENTENCES]   (default 3 rounds, 960 sentences)
#
# Build the baseline from a worktree of an earlier commit, for example:
#   git worktree add --detach /tmp/base fe6c1c9
#   (cd /tmp/base && CARGO_TARGET_DIR=$PWD/target cargo build --release --locked -p drove-cli)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base=${1:?usage: bench/side_by_side.sh BASELINE_BIN NEW_BIN [ROUNDS] [SENTENCES]}
new=${2:?usage: bench/side_by_side.sh BASELINE_BIN NEW_BIN [ROUNDS] [SENTENCES]}
rounds=${3:-3}
sentences=${4:-960}
bash scripts/fetch-assets.sh >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$base" "$work/baseline"
cp "$new" "$work/new"
runs="$work/runs.jsonl"
: >"$runs"
for round in $(seq "$rounds"); do
    # Odd rounds baseline first, even rounds new first.
    order="baseline new"
    ((round % 2)) || order="new baseline"
    for which in $order; do
        bin="$work/$which"
        echo "side_by_side: round $round: $which" >&2
        "$bin" bench allreduce --np 2 --sizes 1KiB,64MiB --json |
            python3 -c 'import json,sys; r=json.load(sys.stdin); [print(json.dumps({"which": sys.argv[1], "round": int(sys.argv[2]), "what": "allreduce-" + x["size"], "median_us": x["median_us"], "busbw_gbps": x["busbw_gbps"]})) for x in r["results"] if x["collective"] == "allreduce"]' \
                "$which" "$round" >>"$runs"
        out="$work/train-$which-$round"
        start=$(date +%s.%N)
        RAYON_NUM_THREADS=1 "$bin" run --np 4 --run-id "sbs-$which-$round" --store "$out/store" -- \
            "$bin" train ner --data assets/conll2003 --model assets/minilm --out "$out" \
            --epochs 1 --batch-size 8 --lr 2.5e-5 --augment-mask 0.15 --seeding derived \
            --max-train-sentences "$sentences" --eval "" --diagnose-every 10 >"$out.log" 2>&1
        end=$(date +%s.%N)
        python3 - "$which" "$round" "$out.log" "$start" "$end" >>"$runs" <<'PY'
import json, re, sys
which, rnd, log, start, end = sys.argv[1:]
text = open(log).read()
m = re.findall(r"trained (\d+) steps on (\d+) rank\(s\): ([0-9.]+) sentences/s", text)
if not m:
    sys.exit(f"no throughput line in {log}:\n{text[-2000:]}")
steps, world, sps = m[-1]
print(json.dumps({"which": which, "round": int(rnd), "what": "train-4-ranks", "steps": int(steps),
                  "sentences_per_s": float(sps), "wall_s": float(end) - float(start)}))
PY
    done
done
python3 - "$runs" "$base" "$new" "$rounds" "$sentences" <<'PY'
import json, os, statistics, sys, time
path, base, new, rounds, sentences = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
out = {"command": f"bash bench/side_by_side.sh {base} {new} {rounds} {sentences}",
       "machine": {"nproc": os.cpu_count(), "cpu": cpu, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
       "runs": rows, "medians": {}}
for what in sorted({r["what"] for r in rows}):
    key = "sentences_per_s" if what.startswith("train") else "median_us"
    pick = lambda w: statistics.median(r[key] for r in rows if r["what"] == what and r["which"] == w)
    b, n = pick("baseline"), pick("new")
    out["medians"][what] = {"metric": key, "baseline": b, "new": n, "new_over_baseline": n / b}
print(json.dumps(out, indent=1))
PY

#!/usr/bin/env bash
# The story, reproduced on 4 ranks: the same short fine-tune of MiniLM-L6 on
# CoNLL-2003 with 15% masking augmentation, once with the story's naive seeding
# (every rank and worker the same stream) and once with drove's derived seeding,
# comparing the ranks' masks and local gradients every 5 steps. Both runs'
# metrics go to one coordinator store and are read back with `drove metrics`.
#
#   bash bench/story.sh [SENTENCES]     (default 2000 training sentences, 1 epoch)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
sentences=${1:-2000}
bash scripts/fetch-assets.sh >/dev/null
cargo build --release --locked -p drove-cli
drove=target/release/drove
out=runs/story
rm -rf "$out"
mkdir -p "$out"
for seeding in naive derived; do
    echo "== $seeding"
    "$drove" run --np 4 --run-id "story-$seeding" --store "$out/store" -- \
        "$drove" train ner --out "$out/$seeding" --max-train-sentences "$sentences" --epochs 1 \
        --batch-size 8 --lr 2.5e-5 --augment-mask 0.15 --seeding "$seeding" --workers 4 \
        --diagnose-every 5 --eval test --json | tee "$out/$seeding.json"
done
for seeding in naive derived; do
    for name in mask_agreement grad_cosine test_f1; do
        echo "== drove metrics --run story-$seeding --name $name"
        "$drove" metrics --store "$out/store" --run "story-$seeding" --name "$name" --json > "$out/$seeding.$name.json"
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); pts=d.get('points', d); print(json.dumps(pts)[:300])" "$out/$seeding.$name.json"
    done
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = {}
for s in ("naive", "derived"):
    last = open(f"{out}/{s}.json").read().strip().splitlines()[-1]
    summary = json.loads(last.split("] ", 1)[1] if last.startswith("[") else last)
    a = summary["mask_agreement"]
    rows[s] = {
        "mask_agreement": a["mean_agreement"], "expected_independent": a["expected"], "sigma": a["sigma"],
        "within_3_sigma": a["within_3_sigma"], "diagnosed_steps": a["steps"],
        "grad_cosine": summary["grad_cosine"], "test_f1": summary["test_f1"], "steps": summary["steps"],
        "sentences_per_s": summary["sentences_per_s"],
    }
print(json.dumps({"benchmark": "story", "runs": rows}, indent=1))
PY

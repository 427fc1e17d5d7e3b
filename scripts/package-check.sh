#!/usr/bin/env bash
# Every crate packaged, and each built alone from its own tarball: what
# `cargo package --workspace` verifies, in check mode and on the test
# command's target folder.
#
#   1. `cargo package --no-verify`: the tarballs, their file lists and
#      normalised manifests (a path dependency without a version fails here);
#   2. the tarballs unpacked side by side into one scratch workspace whose
#      `[patch.crates-io]` points each drove crate at its unpacked copy, so a
#      crate sees the others only as their tarballs hold them;
#   3. for each crate, `cargo check -p CRATE` there (its library and binaries, as cargo's verification builds): its features
#      resolved for it alone (resolver 3 unifies only what one command
#      builds), every source, build script and generated file from its
#      tarball.
#
# cargo's own verification builds each crate in full and, since each has its
# own features, most of its dependencies again: on CI's 2 cores that was the
# longest step after the tests. Checking proves the same of the tarballs
# (nothing missing, nothing leaning on another crate's features) and reuses
# the check artifacts clippy left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
target=${CARGO_TARGET_DIR:-$PWD/target}
rm -f "$target"/package/*.crate
cargo package --workspace --locked --offline --allow-dirty --no-verify
work="$target/package-check"
rm -rf "$work"
mkdir -p "$work"
members=()
for crate in "$target"/package/*.crate; do
    tar -xzf "$crate" -C "$work"
    members+=("$(basename "$crate" .crate)")
done
{
    echo '# Written by scripts/package-check.sh: the packaged crates, each from its tarball.'
    echo '[workspace]'
    echo 'resolver = "3"'
    echo 'members = ['
    for m in "${members[@]}"; do echo "    \"$m\","; done
    echo ']'
    echo '[patch.crates-io]'
    for m in "${members[@]}"; do echo "${m%-*} = { path = \"$m\" }"; done
} >"$work/Cargo.toml"
# The workspace's versions of every dependency (cargo drops what no tarball
# uses, offline).
cp Cargo.lock "$work/Cargo.lock"
for m in "${members[@]}"; do
    echo "package-check: ${m%-*} alone, from $m.crate ($(date +%T))"
    CARGO_TARGET_DIR="$target" cargo check --manifest-path "$work/Cargo.toml" --offline --quiet \
        -p "${m%-*}"
done
echo "package-check: ${#members[@]} crates packaged, each checked alone from its tarball"

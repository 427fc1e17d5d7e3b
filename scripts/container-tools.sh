#!/usr/bin/env bash
# What the container test needs, from the Debian archive (no container registry
# is reachable here): podman, runc and debootstrap; a containers.conf that runs
# every container with runc and no default ulimits (crun fails on setrlimit
# here); and the base image `debian:bookworm-slim`, made with
# `debootstrap --variant=minbase bookworm` and imported under that name.
#
#   bash scripts/container-tools.sh     # prints the containers.conf to export as CONTAINERS_CONF
#
# As root on Debian only; elsewhere it prints why on stderr and nothing on
# stdout (the test then skips with that reason). Idempotent: a second run finds
# everything in place in a second or two.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "container-tools: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
    say "not root: the container test will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    say "no apt-get (not Debian): the container test will skip"
    exit 0
fi

missing=()
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]} from the Debian archive"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 || say "apt-get update failed; trying the cached lists"
    # With Debian's recommends: netavark and aardvark-dns (the network backend
    # the test uses), iptables, fuse-overlayfs, catatonit.
    if ! apt-get install -y -qq podman runc debootstrap netavark aardvark-dns iptables >&2; then
        say "could not install ${missing[*]}: the container test will skip"
        exit 0
    fi
fi

dir="$PWD/target/containers"
mkdir -p "$dir"
conf="$dir/containers.conf"
cat >"$conf" <<'EOF'
# Written by scripts/container-tools.sh: crun fails on setrlimit on this kind of
# machine, runc works; no default ulimits for the same reason.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$conf"

base="docker.io/library/debian:bookworm-slim"
if ! podman image exists "$base" 2>/dev/null; then
    mirror="${DROVE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
    rootfs="$dir/bookworm-rootfs"
    say "making $base with debootstrap --variant=minbase bookworm from $mirror"
    rm -rf "$rootfs"
    started=$(date +%s)
    if ! debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$dir/debootstrap.log" 2>&1; then
        say "debootstrap failed (log: $dir/debootstrap.log): the container test will skip"
        tail -5 "$dir/debootstrap.log" >&2
        exit 0
    fi
    # Slim, as the official image: no apt lists or caches, no docs.
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/usr/share/doc/* \
        "$rootfs"/usr/share/man/*
    tar -C "$rootfs" -c . | podman import --change 'CMD ["bash"]' - "$base" >&2
    rm -rf "$rootfs"
    say "imported $base in $(( $(date +%s) - started )) s"
fi
echo "$conf"

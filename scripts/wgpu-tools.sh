#!/usr/bin/env bash
# Mesa's software Vulkan (lavapipe) and the Vulkan loader, for the tests that
# train on burn's wgpu backend without a GPU: Debian 12's mesa-vulkan-drivers
# and libvulkan1 (16 MB; the adapter is "llvmpipe (LLVM 15.0.6, 256 bits)").
#
#   bash scripts/wgpu-tools.sh     # prints the Vulkan driver manifest (ICD) folder, or nothing
#
# Installs them as root on Debian when missing; elsewhere it says why on
# stderr, prints nothing, and the wgpu tests skip with that reason.
# Idempotent.
set -euo pipefail

say() { echo "wgpu-tools: $*" >&2; }

icd=/usr/share/vulkan/icd.d
have() { [ -f "$icd/lvp_icd.x86_64.json" ] || ls "$icd"/lvp_icd.*.json >/dev/null 2>&1; }
loader() { ldconfig -p 2>/dev/null | grep 'libvulkan\.so\.1 ' >/dev/null; }
if have && loader; then
    echo "$icd"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "not root and Mesa's lavapipe or the Vulkan loader missing: the wgpu tests will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    say "no apt-get (not Debian): the wgpu tests will skip"
    exit 0
fi
say "installing mesa-vulkan-drivers and libvulkan1 from the Debian archive"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2 || say "apt-get update failed; trying the cached lists"
if ! apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers libvulkan1 >&2; then
    say "could not install mesa-vulkan-drivers: the wgpu tests will skip"
    exit 0
fi
if have && loader; then
    echo "$icd"
else
    say "mesa-vulkan-drivers installed but no lavapipe manifest in $icd or no libvulkan.so.1: the wgpu tests will skip"
fi

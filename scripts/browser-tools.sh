#!/usr/bin/env bash
# What the report test needs to load `drove report`'s page in a real browser:
# Debian's headless Chromium (package chromium-headless-shell, from the Debian
# archive; no browser download from elsewhere).
#
#   bash scripts/browser-tools.sh     # prints the browser's path to export as DROVE_CHROMIUM
#
# Finds an installed chromium-headless-shell or chromium first. Otherwise it
# installs the package as root on Debian; elsewhere it prints why on stderr and
# nothing on stdout (the browser check of the report test then skips with that
# reason). Idempotent.
set -euo pipefail

say() { echo "browser-tools: $*" >&2; }

find_browser() {
    for b in chromium-headless-shell chromium; do
        for dir in /usr/bin /usr/lib/chromium; do
            if [ -x "$dir/$b" ]; then
                echo "$dir/$b"
                return 0
            fi
        done
    done
    return 1
}

if browser="$(find_browser)"; then
    echo "$browser"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "not root and no Chromium installed: the report test's browser check will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    say "no apt-get (not Debian): the report test's browser check will skip"
    exit 0
fi
say "installing chromium-headless-shell from the Debian archive"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2 || say "apt-get update failed; trying the cached lists"
if ! apt-get install -y -qq --no-install-recommends chromium-headless-shell >&2; then
    say "could not install chromium-headless-shell: the report test's browser check will skip"
    exit 0
fi
if browser="$(find_browser)"; then
    echo "$browser"
else
    say "chromium-headless-shell installed, but no binary found in /usr/bin or /usr/lib/chromium"
fi

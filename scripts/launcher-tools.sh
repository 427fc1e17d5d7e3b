#!/usr/bin/env bash
# The real launchers the launcher tests run drove under: OpenMPI's mpirun
# (openmpi-bin), Slurm's daemons and commands (slurm-wlm) and munge, all from
# the Debian archive.
#
#   bash scripts/launcher-tools.sh
#
# Installs what is missing as root on Debian; elsewhere it says why on stderr
# and the tests that need a launcher skip with that reason. Starts no daemon:
# the Slurm test starts its own munged, slurmctld and slurmd. Idempotent.
set -euo pipefail

say() { echo "launcher-tools: $*" >&2; }

missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
{ command -v slurmd >/dev/null && command -v slurmctld >/dev/null && command -v srun >/dev/null; } ||
    missing+=(slurm-wlm)
command -v munged >/dev/null || missing+=(munge)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "not root and ${missing[*]} missing: the tests under those launchers will skip"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    say "no apt-get (not Debian) and ${missing[*]} missing: the tests under those launchers will skip"
    exit 0
fi
say "installing ${missing[*]} from the Debian archive"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2 || say "apt-get update failed; trying the cached lists"
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
    say "could not install ${missing[*]}: the tests under those launchers will skip"
fi

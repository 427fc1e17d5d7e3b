#!/usr/bin/env bash
# Scaling on slow links: MiniLM fine-tuned at 1, 2 and 4 ranks, each rank in its
# own network namespace behind a veth link limited with `tc ... tbf`, at each of
# two rates; drove with the all-reduce overlapping backward (the word embedding
# sent as the rows the batch touched, the default), drove without overlap, drove
# overlapped with the embedding dense (--dense-embeddings), and PyTorch DDP over
# gloo (its own bucketed overlap, bucket_cap_mb at its default, dense embedding)
# in the same run. Prints one JSON object.
#
#   bash bench/scaling.sh > /tmp/scaling.json    # as root, after scripts/fetch-assets.sh
#
# Per rate and world size the runs go back to back (drove overlapped, drove
# not, drove dense, DDP); the one-rank runs (no link) go first. Every batch is padded to 128
# tokens, so every step does the same work: a step's time changes with the
# world only through communication and contention. Each run reports the mean
# over its timed steps of the step and its parts: compute (forward and
# backward), exposed communication (what the step waited for after backward),
# communication measured apart (drove: the all-reduce of the run without
# overlap, the same buckets on the same link; DDP: its buckets all-reduced
# alone) and the optimizer. The summary gives, per rate and world size, each
# side's step, sentences/s, scaling efficiency (the one-rank step over this
# step: the same work per rank) and the overlapped step over
# max(compute, communication) + optimizer, with rank 0's compute and with the
# slowest rank's (each side's ranks compare their compute of each step; a
# synchronous step waits for the slowest, and here ranks share cores).
#
# The namespaces: a bridge, one namespace for the coordinator and one per rank
# (names dvs<pid>..., addresses 10.250.8.(10+i)/24), both ends of each rank's
# veth shaped with tbf (egress of each: the link's rate each way). drove's ranks
# rendezvous through the coordinator (DROVE_COMM_TRANSPORT=tcp: the namespaces
# share one kernel); DDP's through rank 0's address. Everything made is removed
# on exit. Needs root, iproute2 (tc), python3 (venv at target/bench-venv from
# bench/netns-requirements.txt, made or reused here) and the assets.
#
# Env: RATES (default "1gbit 4gbit"), NPS (default "2 4"), BATCH (sentences per
# rank, default 8), STEPS (timed, default 8), WARMUP (default 2), BUCKET_MIB
# (drove's --bucket-mib; default drove's own, 4), THREADS (per rank, default 1), DROVE_BIN (a
# prebuilt drove; default: cargo build --release --locked -p drove-cli).
# Takes about 9 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
rates="${RATES:-1gbit 4gbit}"
nps="${NPS:-2 4}"
batch="${BATCH:-8}"
steps="${STEPS:-8}"
warmup="${WARMUP:-2}"
threads="${THREADS:-1}"
cmd="bash bench/scaling.sh"
for v in RATES NPS BATCH STEPS WARMUP BUCKET_MIB THREADS DROVE_BIN; do
    [ -n "${!v:-}" ] && cmd="$v=\"${!v}\" $cmd"
done
limit=900

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }
log() { echo "scaling: $*" >&2; }
[ -f assets/minilm/model.safetensors ] && [ -f assets/conll2003/train.txt ] ||
    { log "no assets: run scripts/fetch-assets.sh first"; exit 1; }

max_np=1
for n in $nps; do [ "$n" -gt "$max_np" ] && max_np="$n"; done

venv="$root/target/bench-venv"
if ! "$venv/bin/python" -c "import torch.distributed as d, transformers; assert d.is_gloo_available()" 2>/dev/null; then
    log "installing bench/netns-requirements.txt into $venv"
    python3 -m venv "$venv"
    timeout "$limit" "$venv/bin/pip" install --quiet -r bench/netns-requirements.txt >&2
fi

tag="dvs$(printf %05d $(($$ % 100000)))"
subnet="10.250.8"
spaces=$((max_np + 1))
made=0
pids=()
work=""

cleanup() {
    set +e
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
    for ((i = 0; i < made; i++)); do
        ip link delete "${tag}h$i" 2>/dev/null
        ip netns delete "${tag}n$i" 2>/dev/null
    done
    ip link delete "${tag}b" 2>/dev/null
    [ -n "$work" ] && rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

work="$(mktemp -d /tmp/dvs-bench.XXXXXX)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git status --porcelain -- crates services 2>/dev/null | wc -l)"
if [ -z "${DROVE_BIN:-}" ]; then
    binary_from="cargo build --release at $commit, $dirty files under crates/ services/ changed"
    log "building target/release/drove"
    timeout 3600 cargo build --release --locked -q -p drove-cli >&2
    DROVE_BIN="$root/target/release/drove"
else
    binary_from="DROVE_BIN=$DROVE_BIN (prebuilt; HEAD is $commit)"
fi
cp "$DROVE_BIN" "$work/drove"
drove="$work/drove"

ip link add "${tag}b" type bridge
ip link set "${tag}b" up
for ((i = 0; i < spaces; i++)); do
    ip netns add "${tag}n$i"
    made=$((i + 1))
    ip link add "${tag}h$i" type veth peer name "${tag}c$i"
    ip link set "${tag}c$i" netns "${tag}n$i"
    ip link set "${tag}h$i" master "${tag}b" up
    ip -n "${tag}n$i" addr add "$subnet.$((10 + i))/24" dev "${tag}c$i"
    ip -n "${tag}n$i" link set "${tag}c$i" up
    ip -n "${tag}n$i" link set lo up
done

# Each rank's link at `rate`, both ways (the coordinator's stays unshaped).
shape() {
    local rate="$1" i burst
    # A burst of a few milliseconds at the rate, at least 1 MB.
    burst="$(python3 -c "import sys; r = sys.argv[1]; v = float(r[:-4]) * {'g': 1e9, 'm': 1e6}[r[-4]]; print(max(1 << 20, int(v / 8 / 250)))" "$rate")"
    for ((i = 1; i < spaces; i++)); do
        tc qdisc replace dev "${tag}h$i" root tbf rate "$rate" burst "$burst" latency 100ms
        ip netns exec "${tag}n$i" tc qdisc replace dev "${tag}c$i" root tbf rate "$rate" burst "$burst" latency 100ms
    done
}

coord_addr="$subnet.10:50051"
mkdir -p "$work/store"
ip netns exec "${tag}n0" env RUST_LOG=warn "$drove" coordinator --listen "$coord_addr" --store "$work/store" \
    >"$work/coordinator.out" 2>"$work/coordinator.err" &
pids+=($!)
for _ in $(seq 600); do
    grep -q "listening on" "$work/coordinator.out" 2>/dev/null && break
    kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/coordinator.err" >&2; log "the coordinator exited"; exit 1; }
    sleep 0.1
done
grep -q "listening on" "$work/coordinator.out" || { log "the coordinator did not listen within 60 s"; exit 1; }

results="$work/results.jsonl"
: >"$results"
run_no=0

# One run: `impl` (drove, drove-no-overlap, drove-dense, ddp) on n ranks at `rate`; rank 0's JSON appended.
run_ranks() {
    local impl="$1" n="$2" rate="$3" r space rc=0
    local ranks=()
    run_no=$((run_no + 1))
    log "$rate, $n rank(s): $impl"
    for ((r = 0; r < n; r++)); do
        space=$((1 + r))
        if [ "$impl" = ddp ]; then
            timeout "$limit" ip netns exec "${tag}n$space" env \
                GLOO_SOCKET_IFNAME="${tag}c$space" OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" \
                TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 \
                "$venv/bin/python" bench/ddp_scaling.py --rank "$r" --world-size "$n" \
                --master "$subnet.11:$((29600 + run_no))" --batch-size "$batch" --steps "$steps" \
                --warmup-steps "$warmup" --threads "$threads" --timeout "$limit" \
                >"$work/$impl.$r.out" 2>"$work/$impl.$r.err" &
        else
            local flags=()
            [ "$impl" = drove-no-overlap ] && flags+=(--no-overlap)
            [ "$impl" = drove-dense ] && flags+=(--dense-embeddings)
            [ -n "${BUCKET_MIB:-}" ] && flags+=(--bucket-mib "$BUCKET_MIB")
            timeout "$limit" ip netns exec "${tag}n$space" env \
                DROVE_COORDINATOR="http://$coord_addr" DROVE_RUN_ID="dvs-$$-$run_no" \
                DROVE_WORLD_SIZE="$n" DROVE_RANK="$r" DROVE_COMM_TRANSPORT=tcp \
                RAYON_NUM_THREADS="$threads" RUST_LOG=warn \
                "$drove" bench scaling --json --batch-size "$batch" --steps "$steps" \
                --warmup-steps "$warmup" "${flags[@]}" \
                >"$work/$impl.$r.out" 2>"$work/$impl.$r.err" &
        fi
        ranks+=($!)
        pids+=($!)
    done
    r=0
    for pid in "${ranks[@]}"; do
        if ! wait "$pid"; then
            rc=1
            log "$impl at $n: rank $r failed:"
            tail -5 "$work/$impl.$r.err" >&2
        fi
        r=$((r + 1))
    done
    [ "$rc" = 0 ] || exit 1
    python3 - "$work/$impl.0.out" "$impl" "$rate" >>"$results" <<'PY'
import json, sys
path, impl, rate = sys.argv[1:]
row = json.loads(next(l for l in open(path) if l.strip().startswith("{")))
row.update(impl=impl, rate=rate)
print(json.dumps(row))
PY
}

started="$(date +%s)"
for impl in drove ddp; do run_ranks "$impl" 1 none; done
for rate in $rates; do
    shape "$rate"
    for n in $nps; do
        for impl in drove drove-no-overlap drove-dense ddp; do run_ranks "$impl" "$n" "$rate"; done
    done
done
finished="$(date +%s)"

torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
python3 - "$results" "$cmd" "$torch_version" "$binary_from" "$((finished - started))" <<'PY'
import json, os, platform, sys, time
path, command, torch_version, binary_from, wall = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
pick = lambda impl, n, rate: next(r for r in rows if r["impl"] == impl and r["world_size"] == n and r["rate"] == rate)
one = {impl: pick(impl, 1, "none")["parts"]["step"] for impl in ("drove", "ddp")}
table = []
for rate in dict.fromkeys(r["rate"] for r in rows if r["rate"] != "none"):
    for n in sorted({r["world_size"] for r in rows if r["rate"] == rate}):
        d, dn, t = pick("drove", n, rate), pick("drove-no-overlap", n, rate), pick("ddp", n, rate)
        dd = pick("drove-dense", n, rate)
        # drove's communication measured apart: the run without overlap's all-reduce.
        comm = dn["parts"]["exposed_communication"]
        bound = max(d["parts"]["compute"], comm) + d["parts"]["optimizer"]
        ddp_bound = max(t["parts"]["compute"], t["parts"]["communication"]) + t["parts"]["optimizer"]
        # A synchronous step waits for the slowest rank's compute (ranks share cores here).
        slow = max(d["parts"]["slowest_compute"], comm) + d["parts"]["optimizer"]
        ddp_slow = max(t["parts"]["slowest_compute"], t["parts"]["communication"]) + t["parts"]["optimizer"]
        table.append({
            "rate": rate, "ranks": n,
            "drove": {**d["parts"], "sentences_per_s": d["sentences_per_s"], "efficiency": one["drove"] / d["parts"]["step"]},
            "drove_no_overlap": {**dn["parts"], "sentences_per_s": dn["sentences_per_s"], "efficiency": one["drove"] / dn["parts"]["step"]},
            "drove_dense_embeddings": {**dd["parts"], "sentences_per_s": dd["sentences_per_s"], "efficiency": one["drove"] / dd["parts"]["step"]},
            "ddp": {**t["parts"], "sentences_per_s": t["sentences_per_s"], "efficiency": one["ddp"] / t["parts"]["step"]},
            "drove_communication_apart": comm,
            # The overlapped step over max(compute, communication) + optimizer (target <= 1.15).
            "drove_step_over_bound": d["parts"]["step"] / bound,
            "drove_step_over_max_compute_communication": d["parts"]["step"] / max(d["parts"]["compute"], comm),
            "ddp_step_over_bound": t["parts"]["step"] / ddp_bound,
            # The same bounds with the slowest rank's compute.
            "drove_step_over_bound_slowest_rank": d["parts"]["step"] / slow,
            "ddp_step_over_bound_slowest_rank": t["parts"]["step"] / ddp_slow,
            "overlap_speedup": dn["parts"]["step"] / d["parts"]["step"],
            "efficiency_drove_over_ddp": (one["drove"] / d["parts"]["step"]) / (one["ddp"] / t["parts"]["step"]),
        })
print(json.dumps({
    "command": command,
    "machine": {
        "nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "torch": torch_version, "drove": binary_from,
    },
    "network": "one netns per rank + one for the coordinator, veth pairs on one bridge, 10.250.8.0/24; "
               "each rank's veth shaped with tbf at the rate, both ends",
    "wall_s": int(wall),
    "one_rank_step_s": one,
    "table": table,
    "runs": rows,
}, indent=1))
PY

#!/usr/bin/env bash
# All-reduce across network namespaces: drove's TCP ring beside PyTorch's gloo,
# the same namespaces, the same sizes, in the same run. Prints one JSON object.
#
#   bash bench/netns_allreduce.sh [ROUNDS] > /tmp/netns_bench.json    # as root
#
# Builds a bridge and one namespace per "host" (names dvb<pid>..., addresses
# 10.250.7.(10+i)/24 on veth pairs; namespace 0 runs the coordinator, namespace
# 1+r runs rank r), then for each round and N in 2 3: N drove ranks
# (`drove bench allreduce-worker`, rendezvous through the coordinator,
# DROVE_COMM_TRANSPORT=tcp since the namespaces share one kernel), then N gloo
# ranks (bench/gloo_allreduce.py, GLOO_SOCKET_IFNAME = the namespace's veth);
# even rounds run gloo first. Per size the summary gives the median over rounds
# of each side's median time and busbw, and the ratios drove/gloo of each round
# (the two ran back to back), median over rounds.
# Everything made is removed on exit. Needs root, iproute2, python3 (venv at
# target/bench-venv from bench/netns-requirements.txt, made or reused here).
#
# RANKS_PER_HOST=K (default 1) puts K consecutive ranks in each namespace
# (rank r in namespace 1 + r/K): K > 1 makes hosts that several ranks share,
# and drove then runs twice per round, "drove" (DROVE_COMM_TRANSPORT=auto: the
# hierarchical all-reduce) and "drove-flat" (tcp: the flat ring over every
# rank), beside gloo; the summary adds hierarchical/flat and flat/gloo ratios.
#
# Each round also measures one plain TCP stream from rank 0's namespace to rank
# 1's (bench/tcp_stream.py, STREAM_BYTES, default 1 GiB): the most one
# connection moves there, so each busbw reads as a fraction of it.
# Env: SIZES (default 1KiB,64KiB,1MiB,16MiB,64MiB,256MiB), NPS (default "2 3"),
# ITERS (default 10), PROFILE=1 (drove's ranks profile the ring's steps: rank
# 0's time in send, receive, reduction and waiting, and bytes in flight, per
# step and op), DROVE_BIN (a prebuilt drove; default: cargo build --release
# --locked -p drove-cli, then target/release/drove). Takes about 5.5 min for 5
# rounds on 2 cores.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
rounds="${1:-1}"
sizes="${SIZES:-1KiB,64KiB,1MiB,16MiB,64MiB,256MiB}"
nps="${NPS:-2 3}"
iters="${ITERS:-10}"
per_host="${RANKS_PER_HOST:-1}"
# The command as given, for the summary.
cmd="bash bench/netns_allreduce.sh${1:+ $1}"
stream_bytes="${STREAM_BYTES:-1073741824}"
for v in SIZES NPS ITERS PROFILE STREAM_BYTES DROVE_BIN RANKS_PER_HOST; do
    [ -n "${!v:-}" ] && cmd="$v=${!v} $cmd"
done
limit=600

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }

log() { echo "netns_allreduce: $*" >&2; }

# Sizes in bytes, as the worker's --sizes (1024B,...).
bytes_list="$(python3 - "$sizes" <<'PY'
import sys
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
out = []
for part in sys.argv[1].split(","):
    num = part.rstrip("KMGiB")
    out.append(f"{int(num) * units[part[len(num):] or 'B']}B")
print(",".join(out))
PY
)"

max_np=0
for n in $nps; do [ "$n" -gt "$max_np" ] && max_np="$n"; done

# The venv for the gloo side.
venv="$root/target/bench-venv"
if ! "$venv/bin/python" -c "import torch.distributed as d; assert d.is_gloo_available()" 2>/dev/null; then
    log "installing bench/netns-requirements.txt into $venv"
    python3 -m venv "$venv"
    timeout "$limit" "$venv/bin/pip" install --quiet -r bench/netns-requirements.txt >&2
fi

# Names: "dvb" + 5 digits + role + index <= 15 characters.
tag="dvb$(printf %05d $(($$ % 100000)))"
subnet="10.250.7"
spaces=$(((max_np + per_host - 1) / per_host + 1))
last=$((spaces - 1))
# The stream runs between the first two namespaces of ranks.
[ "$spaces" -ge 3 ] || { log "the stream needs two namespaces of ranks: fewer ranks per host"; exit 1; }
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

# drove: built, then copied so a rebuild during the run cannot swap it.
work="$(mktemp -d /tmp/dvb-bench.XXXXXX)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git status --porcelain -- crates services 2>/dev/null | wc -l)"
if [ -z "${DROVE_BIN:-}" ]; then
    binary_from="cargo build --release at $commit, $dirty files under crates/ services/ changed"
    log "building target/release/drove"
    timeout 1800 cargo build --release --locked -q -p drove-cli >&2
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

# The coordinator in namespace 0.
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
# Across the bridge: the last namespace reaches the coordinator.
reach=0
for _ in $(seq 50); do
    if timeout 2 ip netns exec "${tag}n$last" bash -c "exec 3<>/dev/tcp/$subnet.10/50051" 2>/dev/null; then
        reach=1
        break
    fi
    sleep 0.2
done
[ "$reach" = 1 ] || { log "namespace $last cannot reach $coord_addr"; exit 1; }

# Waits for the given ranks' pids; fails (after all) naming each rank that failed.
wait_all() {
    local what="$1" rc=0 r=0
    shift
    for pid in "$@"; do
        if ! wait "$pid"; then
            rc=1
            log "$what: rank $r failed (stderr in $work/$what.$r.err):"
            tail -5 "$work/$what.$r.err" >&2
        fi
        r=$((r + 1))
    done
    return "$rc"
}

results="$work/results.jsonl"
: >"$results"

# One implementation's N ranks, RANKS_PER_HOST per namespace; rank 0's rows appended to $results.
run_ranks() {
    local impl="$1" n="$2" round="$3" load t0 t1 r space transport
    local ranks=()
    log "round $round, $n ranks: $impl"
    load="$(cut -d' ' -f1 /proc/loadavg)"
    t0="$(date +%s.%N)"
    for ((r = 0; r < n; r++)); do
        space=$((1 + r / per_host))
        if [ "$impl" != gloo ]; then
            # One rank per namespace: the ring either way; several: hierarchical unless flat.
            transport=tcp
            [ "$impl" = drove ] && [ "$per_host" -gt 1 ] && transport=auto
            timeout "$limit" ip netns exec "${tag}n$space" env \
                DROVE_COORDINATOR="http://$coord_addr" DROVE_RUN_ID="dvb-$$-r$round-np$n-$impl" \
                DROVE_WORLD_SIZE="$n" DROVE_RANK="$r" DROVE_COMM_TRANSPORT="$transport" \
                RAYON_NUM_THREADS=1 RUST_LOG=warn \
                "$drove" bench allreduce-worker --sizes "$bytes_list" --op sum --iters "$iters" \
                ${PROFILE:+--profile} \
                >"$work/$impl.$r.out" 2>"$work/$impl.$r.err" &
        else
            timeout "$limit" ip netns exec "${tag}n$space" env \
                GLOO_SOCKET_IFNAME="${tag}c$space" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
                "$venv/bin/python" bench/gloo_allreduce.py --rank "$r" --world-size "$n" \
                --master "$subnet.11:$((29500 + round * 10 + n))" --sizes "$bytes_list" \
                --iters "$iters" --timeout "$limit" \
                >"$work/$impl.$r.out" 2>"$work/$impl.$r.err" &
        fi
        ranks+=($!)
        pids+=($!)
    done
    wait_all "$impl" "${ranks[@]}"
    t1="$(date +%s.%N)"
    python3 - "$work/$impl.0.out" "$impl" "$round" "$n" "$t0" "$t1" "$load" >>"$results" <<'PY'
import json, sys
path, impl, rnd, n, t0, t1, load = sys.argv[1:]
for line in open(path):
    if line.strip():
        row = json.loads(line)
        row.update(impl=impl, round=int(rnd), np=int(n), wall_s=float(t1) - float(t0), load1=float(load))
        print(json.dumps(row))
PY
}

# One plain TCP stream, rank 0's namespace to rank 1's; its JSON appended to $streams.
streams="$work/streams.jsonl"
: >"$streams"
run_stream() {
    local round="$1" port=$((28400 + round)) server
    log "round $round: one plain TCP stream of $stream_bytes bytes"
    timeout "$limit" ip netns exec "${tag}n2" python3 bench/tcp_stream.py \
        --serve "$subnet.12:$port" --bytes "$stream_bytes" 2>"$work/stream.serve.err" &
    server=$!
    pids+=($server)
    timeout "$limit" ip netns exec "${tag}n1" python3 bench/tcp_stream.py \
        --send "$subnet.12:$port" --bytes "$stream_bytes" >>"$streams" 2>"$work/stream.send.err" ||
        { cat "$work/stream.send.err" >&2; log "the stream failed"; exit 1; }
    wait "$server"
}

started="$(date +%s)"
for ((round = 1; round <= rounds; round++)); do
    run_stream "$round"
    for n in $nps; do
        # Odd rounds drove first, even rounds gloo first.
        if ((round % 2)); then order="drove gloo"; else order="gloo drove"; fi
        [ "$per_host" -gt 1 ] && if ((round % 2)); then order="drove drove-flat gloo"; else order="gloo drove-flat drove"; fi
        for impl in $order; do run_ranks "$impl" "$n" "$round"; done
    done
done
finished="$(date +%s)"

# The summary, with the machine.
torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
python3 - "$results" "$cmd" "$sizes" "$torch_version" "$binary_from" "$((finished - started))" "$rounds" "$streams" "$per_host" <<'PY'
import json, os, platform, statistics, sys, time
path, command, sizes, torch_version, binary_from, wall, rounds, streams_path, per_host = sys.argv[1:]
per_host = int(per_host)
rows = [json.loads(l) for l in open(path) if l.strip()]
streams = [json.loads(l)["gbps"] for l in open(streams_path) if l.strip()]
stream = statistics.median(streams)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
mem_kib = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
by_round = lambda rs: sorted(rs, key=lambda r: r["round"])
out = {
    "command": command,
    "sizes": sizes,
    "rounds": int(rounds),
    "machine": {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "torch": torch_version,
        "drove": binary_from,
    },
    "network": f"one netns per {per_host} rank(s) + one for the coordinator, veth pairs on one bridge, 10.250.7.0/24",
    "ranks_per_host": per_host,
    "wall_s": int(wall),
    # One plain TCP stream between two of the namespaces, GB/s: what one connection can do.
    "stream_gbps": stream,
    "stream_gbps_per_round": streams,
    "by_np": {},
}
for n in sorted({r["np"] for r in rows}):
    table = []
    for b in sorted({r["bytes"] for r in rows if r["np"] == n}):
        pick = lambda impl: [r for r in rows if r["np"] == n and r["bytes"] == b
                             and r["impl"] == impl and r["collective"] == "allreduce"]
        d, g = pick("drove"), pick("gloo")
        dt = statistics.median(r["median_us"] for r in d)
        gt = statistics.median(r["median_us"] for r in g)
        db = statistics.median(r["busbw_gbps"] for r in d)
        gb = statistics.median(r["busbw_gbps"] for r in g)
        table.append({
            "size": d[0]["size"], "bytes": b,
            "drove_median_us": dt, "drove_busbw_gbps": db,
            "drove_iterations": [r["iterations"] for r in d],
            "gloo_median_us": gt, "gloo_busbw_gbps": gb,
            "gloo_iterations": [r["iterations"] for r in g],
            # Each round's drove and gloo ran back to back: their ratio, median over rounds.
            "busbw_drove_over_gloo": statistics.median(
                x["busbw_gbps"] / y["busbw_gbps"] for x, y in zip(by_round(d), by_round(g))),
            "busbw_drove_over_gloo_of_medians": db / gb,
            "time_gloo_over_drove": statistics.median(
                y["median_us"] / x["median_us"] for x, y in zip(by_round(d), by_round(g))),
            "drove_busbw_over_stream": db / stream,
            "gloo_busbw_over_stream": gb / stream,
            "per_round_drove_us": [r["median_us"] for r in d],
            "per_round_gloo_us": [r["median_us"] for r in g],
        })
        f = pick("drove-flat")
        if f:
            fb = statistics.median(r["busbw_gbps"] for r in f)
            table[-1].update({
                "flat_median_us": statistics.median(r["median_us"] for r in f),
                "flat_busbw_gbps": fb,
                # drove here is the hierarchical all-reduce; per round, then the median.
                "busbw_hierarchical_over_flat": statistics.median(
                    x["busbw_gbps"] / y["busbw_gbps"] for x, y in zip(by_round(d), by_round(f))),
                "busbw_flat_over_gloo": statistics.median(
                    x["busbw_gbps"] / y["busbw_gbps"] for x, y in zip(by_round(f), by_round(g))),
                "flat_busbw_over_stream": fb / stream,
            })
        if any(r.get("profile") for r in d):
            table[-1]["drove_profile_per_round"] = [r.get("profile") for r in by_round(d)]
    bcast = [{k: r[k] for k in ("round", "size", "median_us", "busbw_gbps")}
             for r in rows if r["np"] == n and r["impl"] == "drove" and r["collective"] == "broadcast"]
    small = table[0]
    out["by_np"][str(n)] = {
        "allreduce": table,
        "time_gloo_over_drove_at_" + small["size"]: small["time_gloo_over_drove"],
        "drove_broadcast": bcast,
        # Per round: seconds the N ranks ran, and the 1-minute load average as they started.
        "wall_s": {impl: [round(r["wall_s"], 1) for r in rows if r["np"] == n and r["impl"] == impl
                          and r["bytes"] == small["bytes"] and r["collective"] == "allreduce"]
                   for impl in ("drove", "gloo")},
        "load1": {impl: [r["load1"] for r in rows if r["np"] == n and r["impl"] == impl
                         and r["bytes"] == small["bytes"] and r["collective"] == "allreduce"]
                  for impl in ("drove", "gloo")},
    }
print(json.dumps(out, indent=1))
PY

#!/usr/bin/env bash
# Recovery from a killed rank, drove vs torchrun, in one run (issue 20).
#
#   bash bench/elastic_recovery.sh            # prints one JSON object on stdout
#
# drove: a coordinator and four `drove train ner --world 3:4` members on
# loopback (as crates/drove-cli/tests/elastic.rs starts them); rank 3 SIGKILLs
# itself after step KILL_AT, the other three re-form at world 3 in memory.
# torchrun: `torchrun --nnodes 1:1 --nproc-per-node 4 --max-restarts 1` of
# bench/torchrun_elastic.py (DDP, gloo, CPU), checkpointing every CKPT_EVERY
# steps; rank 3 SIGKILLs itself after step KILL_AT, torchrun restarts the whole
# group at world 4, which reloads the last checkpoint.
#
# Every stderr line is timestamped as it arrives. Recovery is the time from the
# kill line to the first step applied after it (drove: step KILL_AT+1 of the
# new world; torchrun: the first step after the restart, and, separately, the
# time to get back past step KILL_AT). Steps redone: applied steps lost (drove:
# last applied - the step the new world starts from; torchrun: KILL_AT - the
# checkpoint's step) plus the step the kill interrupted.
#
# Environment: SENTENCES (160), KILL_AT (10), CKPT_EVERY (4), LIMIT (seconds per
# side, 900), DROVE_PROFILE (release if built, else debug), SIDES ("drove
# torchrun"; "drove" alone skips torch), KEEP=1 keeps the logs. Each rank gets
# one thread (RAYON_NUM_THREADS=1; torch threads 1).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
log() { echo "elastic_recovery: $*" >&2; }

sentences="${SENTENCES:-160}"
kill_at="${KILL_AT:-10}"
ckpt_every="${CKPT_EVERY:-4}"
limit="${LIMIT:-900}"

profile="${DROVE_PROFILE:-}"
if [ -z "$profile" ]; then
    if [ -x target/release/drove ] && [ -x target/release/drove-coordinator ]; then profile=release; else profile=debug; fi
fi
drove="$root/target/$profile/drove"
coordinator="$root/target/$profile/drove-coordinator"
for b in "$drove" "$coordinator"; do
    [ -x "$b" ] || { log "no $b: cargo build$([ "$profile" = release ] && echo ' --release') -p drove-cli -p drove-coordinator"; exit 1; }
done
[ -f assets/minilm/model.safetensors ] || bash scripts/fetch-assets.sh >&2

# The venv for the torchrun side (bench/netns_allreduce.sh's, plus transformers).
venv="$root/target/bench-venv"
if [[ " ${SIDES:-torchrun} " == *" torchrun "* ]] && ! "$venv/bin/python" -c "import torch, transformers" 2>/dev/null; then
    log "installing torch, numpy and transformers into $venv"
    python3 -m venv "$venv"
    timeout "$limit" "$venv/bin/pip" install --quiet torch==2.15.0 numpy==2.4.6 transformers==5.24.0 >&2
fi

work="$(mktemp -d -t drove-elastic-XXXXXX)"
driver=""
cleanup() {
    set +e
    [ -n "$driver" ] && kill -TERM "$driver" 2>/dev/null && wait "$driver" 2>/dev/null
    # Whatever the driver started and could not end itself (it lists each pid it starts).
    if [ -f "$work/pids" ]; then
        while read -r pid; do kill -KILL "$pid" 2>/dev/null; done <"$work/pids"
    fi
    if [ "${KEEP:-0}" = 1 ]; then log "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export ER_DROVE="$drove" ER_COORDINATOR="$coordinator" ER_PROFILE="$profile" ER_WORK="$work"
export ER_SENTENCES="$sentences" ER_KILL_AT="$kill_at" ER_CKPT_EVERY="$ckpt_every" ER_LIMIT="$limit"
export ER_VENV="$venv" ER_ROOT="$root" ER_SIDES="${SIDES:-drove torchrun}"

python3 - <<'PY' &
import json, os, re, shlex, signal, socket, subprocess, sys, threading, time

E = os.environ
root, work, limit = E["ER_ROOT"], E["ER_WORK"], float(E["ER_LIMIT"])
sentences, kill_at, ckpt_every = int(E["ER_SENTENCES"]), int(E["ER_KILL_AT"]), int(E["ER_CKPT_EVERY"])
assets = os.path.join(root, "assets")
procs = []


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child whose stdout and stderr lines are kept with their arrival time."""

    def __init__(self, name, argv, env=None, cwd=None):
        self.name, self.lines, self.exit = name, [], None
        self.p = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        with open(os.path.join(work, "pids"), "a") as f:
            f.write(f"{self.p.pid}\n")
        procs.append(self)
        self.readers = [threading.Thread(target=self._read, args=(s,), daemon=True) for s in (self.p.stdout, self.p.stderr)]
        for r in self.readers:
            r.start()

    def _read(self, stream):
        for raw in iter(stream.readline, b""):
            self.lines.append((time.time(), raw.decode("utf-8", "replace").rstrip("\n")))

    def wait(self, until):
        try:
            self.exit = self.p.wait(timeout=max(0.0, until - time.time()))
        except subprocess.TimeoutExpired:
            self.kill()
            self.exit = self.p.wait()
            return False
        for r in self.readers:
            r.join(5)
        return True

    def kill(self):
        # The whole session: torchrun's workers with it.
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def log(self, path):
        with open(path, "w") as f:
            for t, l in self.lines:
                f.write(f"{t:.3f} {l}\n")


def end_all(*_):
    for p in procs:
        p.kill()
    sys.exit(143)


signal.signal(signal.SIGTERM, end_all)


def mean(xs):
    return round(sum(xs) / len(xs), 2) if xs else None


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


STEP = re.compile(r"step (\d+)/(\d+) .*?([\d.]+) sent/s")


# ---------------------------------------------------------------- drove
def drove_side():
    d = os.path.join(work, "drove")
    os.makedirs(d)
    port = free_port()
    addr = f"127.0.0.1:{port}"
    env = dict(os.environ, RUST_LOG="warn", RAYON_NUM_THREADS="1")
    coord_argv = [E["ER_COORDINATOR"], "--listen", addr, "--store", os.path.join(d, "store")]
    coord = Proc("coordinator", coord_argv, env=env)
    until = time.time() + 60
    while not any("listening on" in l for _, l in coord.lines):
        if time.time() > until or coord.p.poll() is not None:
            raise SystemExit(f"the coordinator did not listen: {coord.lines}")
        time.sleep(0.05)
    member_argv = [E["ER_DROVE"], "train", "ner", "--world", "3:4", "--batch-size", "2",
                   "--epochs", "1", "--max-train-sentences", str(sentences), "--eval", "", "--workers", "1",
                   "--log-every", "1", "--dropout", "0",
                   "--data", os.path.join(assets, "conll2003"), "--model", os.path.join(assets, "minilm"),
                   "--trace-samples", os.path.join(d, "trace.jsonl"),
                   "--fail-at-step", str(kill_at), "--rank-to-fail", "3"]
    t0, load0 = time.time(), loadavg()
    members = []
    for i in range(4):
        argv = member_argv + ["--out", os.path.join(d, f"out-{i}")]
        members.append(Proc(f"m{i}", argv, env=dict(env, DROVE_COORDINATOR=addr, DROVE_RUN_ID="recovery",
                                                      DROVE_MEMBER_ID=f"m{i}")))
    until = t0 + limit
    finished = all([m.wait(until) for m in members])
    wall = time.time() - t0
    coord.kill()
    coord.wait(time.time() + 5)
    for p in members + [coord]:
        p.log(os.path.join(d, f"{p.name}.log"))

    lines = sorted((t, m.name, l) for m in members for t, l in m.lines)
    kill = next(((t, l) for t, _, l in lines if "killing itself with SIGKILL" in l), None)
    gen = [(t, l) for t, _, l in lines if "generation 2: this member is rank" in l]
    starts = [int(re.search(r"at step (\d+)", l).group(1)) for _, l in gen]
    trace = [json.loads(l) for l in open(os.path.join(d, "trace.jsonl"))] if os.path.exists(os.path.join(d, "trace.jsonl")) else []
    world_of = {}
    applied = {}
    for t in trace:
        world_of[t["step"]] = t["world"]
        for s in t["samples"]:
            applied[s[0]] = applied.get(s[0], 0) + 1
    last_before = max((t["step"] for t in trace if t["generation"] == 1), default=None)
    steps = [(t, int(m.group(1)), float(m.group(3))) for t, _, l in lines if (m := STEP.search(l))]
    out = {"binary": E["ER_PROFILE"], "exits": [m.exit for m in members], "finished": finished,
           "wall_s": round(wall, 1), "loadavg_before": load0, "loadavg_after": loadavg(),
           "worlds": sorted({(t["generation"], t["world"]) for t in trace}),
           "samples_applied_once": sorted(applied) == list(range(sentences)) and all(n == 1 for n in applied.values())}
    # The collective that failed: the re-form check at a step boundary (nothing of the
    # next step computed yet) or a step's own all-reduce (that step's work is lost).
    failed = next((m.group(1) for _, _, l in lines if (m := re.search(r'the world ends: .*?all_reduce "([^"]+)"', l))), None)
    interrupted = 0 if failed == "elastic.reform" else 1
    if kill and gen and steps:
        t_kill = kill[0]
        s = starts[0]
        first = next((t for t, n, _ in steps if n == s + 1 and t > t_kill), None)
        out.update({
            "killed_after_step": int(re.search(r"after step (\d+)", kill[1]).group(1)),
            "last_step_applied_before_kill": last_before,
            "new_world_starts_from_step": s,
            "members_agree_on_start": len(set(starts)) == 1,
            "reform_s": round(min(t for t, _ in gen) - t_kill, 2),
            "recovery_s": round(first - t_kill, 2) if first else None,
            "back_past_kill_step_s": round(first - t_kill, 2) if first else None,
            "failed_collective": failed,
            "steps_redone": {"applied_steps_lost": last_before - s, "interrupted": interrupted,
                             "total": last_before - s + interrupted},
        })
    by_world = {}
    for w in sorted(set(world_of.values())):
        mine = [(n, r) for _, n, r in steps if world_of.get(n) == w]
        mine.sort()
        kept = [r for _, r in mine[2:]]
        by_world[str(w)] = {"mean": mean(kept), "steps": len(kept)}
    out["sentences_per_s"] = by_world
    shown = [shlex.join(coord_argv), f"DROVE_COORDINATOR={addr} DROVE_RUN_ID=recovery DROVE_MEMBER_ID=mI RAYON_NUM_THREADS=1 "
             + shlex.join(member_argv) + " --out DIR/out-I   # I = 0..3"]
    return out, [c.replace(root + "/", "").replace(work, "DIR") for c in shown]


# ---------------------------------------------------------------- torchrun
TSTEP = re.compile(r"^([\d.]+) rank 0: step (\d+)/(\d+) world (\d+) .*?([\d.]+) sent/s")


def torch_side():
    d = os.path.join(work, "torchrun")
    os.makedirs(d)
    port = free_port()
    venv = E["ER_VENV"]
    argv = [os.path.join(venv, "bin", "torchrun"), "--nnodes", "1:1", "--nproc-per-node", "4", "--max-restarts", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            os.path.join(root, "bench", "torchrun_elastic.py"),
            "--data", os.path.join(assets, "conll2003"), "--model", os.path.join(assets, "minilm"),
            "--max-train-sentences", str(sentences), "--batch-size", "2", "--threads", "1",
            "--checkpoint-every", str(ckpt_every), "--checkpoint-dir", os.path.join(d, "ckpt"),
            "--fail-at-step", str(kill_at), "--rank-to-fail", "3"]
    # The agent's shared TCPStore keeps the first attempt's gloo addresses, and the
    # restarted group reads them and fails to connect (pytorch/pytorch#135712):
    # every worker group gets its own store, the documented way out.
    fix = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **fix)
    t0, load0 = time.time(), loadavg()
    run = Proc("torchrun", argv, env=env, cwd=root)
    finished = run.wait(t0 + limit)
    wall = time.time() - t0
    run.log(os.path.join(d, "torchrun.log"))
    lines = run.lines
    kill = next(((t, l) for t, l in lines if "killing itself with SIGKILL" in l), None)
    resumed = [(t, l) for t, l in lines if "resumed from step" in l]
    started = [(t, l) for t, l in lines if "started from step" in l]
    ckpts = [float(m.group(1)) for _, l in lines if (m := re.search(r"checkpoint at step \d+ in ([\d.]+) s", l))]
    steps = [(t, int(m.group(2)), int(m.group(4)), float(m.group(5))) for t, l in lines if (m := TSTEP.search(l))]
    out = {"exit": run.exit, "finished": finished, "wall_s": round(wall, 1),
           "loadavg_before": load0, "loadavg_after": loadavg(),
           "checkpoint_every": ckpt_every, "checkpoint_save_s": mean(ckpts)}
    if started:
        out["first_start_to_ready_s"] = round(started[0][0] - t0, 2)
    if kill and resumed:
        t_kill, t_resumed = kill[0], min(t for t, _ in resumed)
        s = int(re.search(r"resumed from step (\d+)", resumed[0][1]).group(1))
        # Rank 0's last lines of the first incarnation may arrive after the kill line.
        after = [(t, n) for t, n, _, _ in steps if t > t_resumed]
        first = after[0] if after else None
        past = next((t for t, n in after if n == kill_at + 1), None)
        out.update({
            "killed_after_step": int(re.search(r"after step (\d+)", kill[1]).group(1)),
            "resumed_from_step": s,
            "restart_s": round(t_resumed - t_kill, 2),
            "recovery_s": round(first[0] - t_kill, 2) if first else None,
            "first_step_after_restart": first[1] if first else None,
            "back_past_kill_step_s": round(past - t_kill, 2) if past else None,
            "steps_redone": {"applied_steps_lost": kill_at - s, "interrupted": 1, "total": kill_at - s + 1},
        })
        # Skip the first 2 steps of each incarnation.
        before = [r for t, n, w, r in steps if t < t_resumed]
        later = [r for t, n, w, r in steps if t > t_resumed]
        kept = before[2:] + later[2:]
    else:
        kept = [r for _, _, _, r in steps][2:]
    out["sentences_per_s"] = {"4": {"mean": mean(kept), "steps": len(kept)}}
    shown = " ".join(f"{k}={v}" for k, v in fix.items()) + " " + shlex.join(argv)
    return out, [shown.replace(root + "/", "").replace(work, "DIR")]


def machine():
    mem = next(l for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), None)
    try:
        versions = subprocess.run([os.path.join(E["ER_VENV"], "bin", "python"), "-c",
                                   "import torch, transformers; print(torch.__version__, transformers.__version__)"],
                                  capture_output=True, text=True).stdout.split()
    except OSError:
        versions = []
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory_gib": round(int(mem.split()[1]) / 2**20, 1),
            "loadavg_at_start": loadavg(), "torch": versions[0] if versions else None,
            "transformers": versions[1] if len(versions) > 1 else None}


t0 = time.time()
result = {"benchmark": "elastic_recovery", "machine": machine(),
          "settings": {"sentences": sentences, "batch_per_rank": 2, "kill_after_step": kill_at, "rank_killed": 3,
                       "threads_per_rank": 1}}
sides = E["ER_SIDES"].split()
drove, drove_cmds, torch_, torch_cmds = {}, [], {}, []
if "drove" in sides:
    print("elastic_recovery: drove side", file=sys.stderr, flush=True)
    drove, drove_cmds = drove_side()
if "torchrun" in sides:
    print("elastic_recovery: torchrun side", file=sys.stderr, flush=True)
    torch_, torch_cmds = torch_side()
result["commands"] = {"drove": drove_cmds, "torchrun": torch_cmds}
result["drove"], result["torchrun"] = drove, torch_
ratio = lambda k: round(torch_[k] / drove[k], 2) if torch_.get(k) and drove.get(k) else None
result["ratio_torchrun_over_drove"] = {"recovery_s": ratio("recovery_s"), "back_past_kill_step_s": ratio("back_past_kill_step_s")}
result["total_wall_s"] = round(time.time() - t0, 1)
print(json.dumps(result, indent=1))
PY
driver=$!
wait "$driver"

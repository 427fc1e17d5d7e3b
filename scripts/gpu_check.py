"""The GPU check's run, on the check machine (see scripts/gpu-check.sh): issue
49's step 8, one call of about five minutes (so that a second call fits the
session's 15 device-minutes), the same binary and the same batches for every
configuration, PyTorch in the same call.

Unpacks what `gpu-check.sh prepare` packed (into a work folder outside the
output folder, so that only the JSON and the profile log come back), picks the
CUDA headers and the libraries (NVRTC, NCCL, cuBLAS) from one place
(`choose_cuda`), records their versions, then within the time budget (290 s)
runs the phases below, most valuable first, each with its own deadline
(`phase_deadline`: its cap, less what the phases after it are kept), writing
the JSON after every phase so that a cut run keeps what it measured (a
`drove bench train` cut at its deadline still gives the steps it logged,
marked `partial`):

  1. `host_floor`: `drove bench train` at batch 1 with every step of issue 49
     on (30 steps after 5), on a new, empty kernel cache (`--kernel-cache
     WORK/kcache`, DROVE_KERNEL_CACHE for every later drove): the step time
     when the GPU has almost nothing to do;
  2. batch 32 and batch 256, 40 timed steps after 5 untimed (bucket window
     16: the same batches on every run): PyTorch first, in one process
     (`pytorch_ner.py --batch-size 32,256 --tf32 both`: eager f32 with fused
     AdamW, then with TF32 allowed; `pytorch_b32_f32`, ...), then drove with
     every step on (`drove_b32_all_steps`, `drove_b256_all_steps`), the
     baseline (the behaviour before issue 49: `drove_b*_baseline`) and steps 2
     and 5 alone (`drove_b*_steps_2_5`); `STEP_CONFIGS` names each one's flags.
     Batch 256 takes fewer steps where the same configuration's batch-32 run
     says 40 would not fit its deadline (`b256_steps`);
  3. `launches`: kernels launched, blocking reads and uploads a step, from a
     short `--count-launches` run at batch 32 with every step on but the
     pre-warm (which changes no step's launches), so that its first step, on
     the kernel cache the earlier runs filled, is the warm first step;
  4. `profile_b256`: every kernel's time at batch 256 with every step on (a
     few steps, no pre-warm), from cubecl's profiling log (`cubecl.toml` in the
     run's folder: `[profiling.logger] level = "basic"`, read by cubecl 0.10's
     `CubeClRuntimeConfig::from_current_dir`, which drove's configuration
     starts from), ranked by time into a top 20 (`profile_ranking`). On CUDA
     cubecl times a kernel by the host clock around a sync on each side
     (`TimingMethod::System`): launch latency is included, the overlap of
     launches is not, and a kernel's first launch includes its compile
     (hence `count x median` as the ranked time);
  5. `matmul`: `drove bench matmul --device cuda`, cubek's strategies on
     MiniLM's GEMM shape classes beside cuBLAS (libcublas linked in
     WORK/lib), as many shapes as a budget fits; `matmul_summary` gives each
     shape's best cubek kernel against cuBLAS;
  6. `train_equivalence_world4_f32`: four ranks on the one GPU under `drove
     run --np 4` with `--gradient-path host --matmul drove --matmul-precision
     f32` (batch 4 each) against one rank (batch 16): parameters after 5
     steps within 1e-5 relative, each step's loss and gradient norm within
     SCALE_BOUND (`scale_difference`);
  7. `story_gpu`: the diversity story on four ranks of the one GPU, launched
     as the README shows it (`drove run --np 4 -- drove train ner --device
     cuda:0`, the gradient path left at `auto`; masking augmentation 0.15,
     diagnosed every 5 of 12 steps): naive seeding agrees 1.0 and sets the
     alarm off, derived seeding lies within 3 sigma of p^2+(1-p)^2 = 0.745 and
     does not;
  8. only with time left: `nccl` (world 1) and `in_place`; world 2 where the
     NCCL loaded allows two ranks on one GPU (2.30 and later); test entity F1
     after one epoch, both.

`targets` (last in the JSON, rewritten with every write): drove with every
step on over PyTorch eager f32 + fused AdamW, means over the timed steps, at
batch 256 >= 0.6 and batch 32 >= 0.4 (1.0 at both stays the goal), the
medians' ratio beside; each run's mean within 5% of its median; peak memory
beside PyTorch's; every configuration against both PyTorch runs
(`comparisons`); reads and uploads a step; the warm first step.

`python3 gpu_check.py --dry-run --drove DROVE` builds every command line the
check runs and has the local binary parse each (clap's `--help` after the
flags: a flag or value it does not know fails) and pytorch_ner.py check its
own (`--check-args`, no torch needed), so that a typo costs no GPU call;
`gpu-check.sh prepare` ends with it. With `--wgpu-data` and `--wgpu-model` it
also runs the profile phase for real on `--device wgpu` (lavapipe here).

Where the weights did not travel both sides start from random weights of the
same shape (`--random-init`; a hidden flag of `drove train ner`).

Standard library only (the check machine has Python and torch, no network;
numpy is used when present); the pure helpers are unit-tested by
scripts/test_gpu_check.py.
"""

import argparse
import ctypes
import json
import lzma
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

# NCCL accepts several ranks on one GPU from 2.30 (NCCL_VERSION_CODE 23000),
# when NCCL_MULTI_RANK_GPU_ENABLE=1; before, it refuses with "Duplicate GPU detected".
MULTI_RANK_GPU_FROM = 23000

# The warm first step's target (seconds).
WARM_FIRST_STEP_TARGET_S = 3.0

# The throughput runs: timed steps after untimed ones, at both batch sizes
# (the same batches for drove and PyTorch: the same seed, bucket window and
# warm-up), and the host floor's.
BATCHES = (32, 256)
STEPS = 40
WARMUP = 5
BUCKET_WINDOW = 16
HOST_FLOOR = {"batch": 1, "steps": 30, "warmup": 5}
# The launch-counting and profiling runs: short.
LAUNCHES = {"batch": 32, "steps": 5, "warmup": 2}
PROFILE = {"batch": 256, "steps": 3, "warmup": 1}
# How many kernels the profile ranking keeps.
PROFILE_TOP = 20

# drove with every step on over PyTorch eager f32 + fused AdamW (sentences/s,
# means over the timed steps): the targets at each batch size.
RATIO_TARGETS = {32: 0.4, 256: 0.6}
# A run's mean step may lie this far from its median (relative).
MEAN_MEDIAN_TOLERANCE = 0.05

# The switches of issue 49's steps, as `drove bench train` flags (defaults
# first in each flag's help): the behaviour before the issue, every step on,
# and steps 2 (split-K dense gradients) and 5 (the embedding backward) alone.
# `--matmul-precision` stays at its default (tf32) in all three.
BASELINE = (("--dropout-masks", "host"), ("--loss-read", "after-forward"), ("--dense", "plain"),
            ("--embedding-grad", "select"), ("--matmul", "burn"), ("--prewarm", "off"))
ALL_STEPS = (("--dropout-masks", "device"), ("--loss-read", "at-update"), ("--dense", "split-k"),
             ("--embedding-grad", "sliced"), ("--matmul", "drove"), ("--prewarm", "on"))
STEP_CONFIGS = {
    "all_steps": ALL_STEPS,
    "baseline": BASELINE,
    "steps_2_5": tuple((f, {"--dense": "split-k", "--embedding-grad": "sliced"}.get(f, v)) for f, v in BASELINE),
}
# The order the throughput runs take: the targets' configuration first.
CONFIG_ORDER = ("all_steps", "baseline", "steps_2_5")

# The phases in the order they run, each with its cap (seconds) and the floor
# an earlier phase leaves it: a phase's deadline is its cap, or less where the
# time left less the floors of the phases still to come is less. Phases not
# named here (NCCL, world 2, F1) get what is left, less FINAL_RESERVE_S.
PLAN = (
    ("host_floor", 50, 20),
    ("pytorch", 60, 30),
    ("drove_b32_all_steps", 35, 12),
    ("drove_b256_all_steps", 40, 15),
    ("drove_b32_baseline", 35, 12),
    ("drove_b256_baseline", 40, 15),
    ("drove_b32_steps_2_5", 30, 10),
    ("drove_b256_steps_2_5", 35, 12),
    ("launches", 25, 8),
    ("profile_b256", 30, 10),
    ("matmul", 40, 15),
    ("equivalence_world1", 20, 8),
    ("equivalence_world4", 35, 12),
    ("story_naive", 30, 10),
    ("story_derived", 30, 10),
)
# Seconds kept for writing the JSON at the end.
FINAL_RESERVE_S = 5
# The budget `gpu-check.sh run` gives (seconds), inside its timeout.
BUDGET_S = 290


def phase_deadline(phase, left_s, plan=PLAN, skip=()):
    """Seconds `phase` may run when `left_s` are left: its cap, at most
    `left_s` less FINAL_RESERVE_S and the floors of the phases after it in
    `plan` (but those in `skip`, which will not run); never below 0. A phase
    not in `plan` gets what is left less FINAL_RESERVE_S, capped by nothing."""
    names = [name for name, _, _ in plan]
    if phase not in names:
        return max(0.0, left_s - FINAL_RESERVE_S)
    i = names.index(phase)
    reserve = FINAL_RESERVE_S + sum(floor for name, _, floor in plan[i + 1:] if name not in skip)
    return max(0.0, min(float(plan[i][1]), left_s - reserve))


def log(msg):
    print(f"gpu-check: {msg}", file=sys.stderr, flush=True)


class Report:
    """The JSON, rewritten whole after every change; `summary(data)`, when
    given, is written last as `targets`."""

    def __init__(self, path, summary=None):
        self.path = path
        self.summary = summary
        self.data = {"check": "drove gpu check", "started_unix": time.time(), "errors": []}

    def set(self, key, value):
        self.data[key] = value
        self.write()

    def error(self, phase, message):
        self.data["errors"].append({"phase": phase, "error": message[-4000:]})
        self.write()

    def write(self):
        data = self.data
        if self.summary is not None:
            data = {k: v for k, v in self.data.items() if k != "targets"}
            try:
                data["targets"] = self.summary(self.data)
            except Exception as e:  # a summary never costs the measurements
                data["targets"] = {"error": f"{type(e).__name__}: {e}"}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, self.path)


def unxz(src, dst):
    with lzma.open(src) as i, open(dst, "wb") as o:
        shutil.copyfileobj(i, o, 1 << 20)


def unpack(pack, work):
    """The binary, the data and the model folder, decompressed into `work`
    (outside the output folder: none of it comes back)."""
    os.makedirs(work, exist_ok=True)
    drove = os.path.join(work, "drove")
    unxz(os.path.join(pack, "drove.xz"), drove)
    os.chmod(drove, 0o755)
    data = os.path.join(work, "conll2003")
    os.makedirs(data, exist_ok=True)
    for name in ("train", "valid", "test"):
        unxz(os.path.join(pack, "conll2003", name + ".txt.xz"), os.path.join(data, name + ".txt"))
    model = os.path.join(work, "minilm")
    os.makedirs(model, exist_ok=True)
    for name in os.listdir(os.path.join(pack, "minilm")):
        src = os.path.join(pack, "minilm", name)
        if name.endswith(".xz"):
            unxz(src, os.path.join(model, name[:-3]))
        else:
            shutil.copy(src, os.path.join(model, name))
    return drove, data, model


# ---------------------------------------------------------------------------
# The CUDA headers and libraries, from one place.

def toolkit_lib_dirs(root):
    return [os.path.join(root, d) for d in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib"))]


def wheel_lib_dirs(site_roots):
    """The wheels' lib folders: every site's nvidia/cu13/lib first, then the
    other nvidia/*/lib folders (nccl, the cu12 packages) in name order."""
    first = [os.path.join(s, "nvidia", "cu13", "lib") for s in site_roots]
    rest = []
    for s in site_roots:
        base = os.path.join(s, "nvidia")
        if os.path.isdir(base):
            rest += [os.path.join(base, d, "lib") for d in sorted(os.listdir(base)) if d != "cu13"]
    return first + rest


def find_library(dirs, prefix):
    """The first file in `dirs` (in order) whose name starts with `prefix`."""
    for d in dirs:
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.startswith(prefix):
                    return os.path.join(d, f)
    return None


def under(path, root):
    return path is not None and os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def choose_cuda(site_roots, nvcc=None, cuda_path=None, extra_lib_dirs=()):
    """The CUDA root NVRTC compiles burn's kernels against (`CUDA_PATH`: cubecl
    passes CUDA_PATH/include and CUDA_PATH/include/cccl to NVRTC) and the
    libnvrtc and libnccl to link, from one place.

    The root is the first of: a `CUDA_PATH` already set; the toolkit of
    `nvcc`; the CUDA 13 wheels' tree `nvidia/cu13` of a site-packages folder
    (cuda_runtime.h from nvidia-cuda-runtime, include/crt from
    nvidia-cuda-crt, include/cccl from nvidia-cuda-cccl) -- the first that
    holds include/cuda_runtime.h. libnvrtc comes from that root's own lib
    folders first, then from nvidia/cu13/lib, only then from the other wheels
    (so a cu12 library is never taken while a cu13 one is there); libcublas
    (the matmul sweep's reference: `nvidia-cublas`) likewise, and where it is
    missing only `notes` say so."""
    candidates = []
    if cuda_path:
        candidates.append((cuda_path, "CUDA_PATH", toolkit_lib_dirs(cuda_path)))
    if nvcc:
        root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
        candidates.append((root, "nvcc", toolkit_lib_dirs(root)))
    for s in site_roots:
        root = os.path.join(s, "nvidia", "cu13")
        candidates.append((root, "nvidia-cu13 wheels", [os.path.join(root, "lib")]))
    chosen = next((c for c in candidates
                   if os.path.isfile(os.path.join(c[0], "include", "cuda_runtime.h"))), None)
    problems = []
    lib_dirs = (chosen[2] if chosen else []) + wheel_lib_dirs(site_roots) + list(extra_lib_dirs)
    lib_dirs = list(dict.fromkeys(lib_dirs))
    nvrtc = find_library(lib_dirs, "libnvrtc.so.")
    nccl = find_library(lib_dirs, "libnccl.so.")
    cublas = find_library(lib_dirs, "libcublas.so.")
    notes = []
    if cublas is None:
        notes.append("no libcublas.so.* found (pip: nvidia-cublas): the matmul sweep runs without cuBLAS")
    elif os.path.basename(cublas).split(".so.")[-1].split(".")[0] == "12" and chosen and \
            chosen[1] == "nvidia-cu13 wheels":
        notes.append(f"{cublas} is CUDA 12's, the headers CUDA 13's")
    if chosen is None:
        problems.append("no CUDA headers: no CUDA_PATH, no nvcc, and no site-packages/nvidia/cu13/include/"
                        "cuda_runtime.h (pip: nvidia-cuda-runtime, nvidia-cuda-crt, nvidia-cuda-cccl)")
    else:
        root = chosen[0]
        for need, package in ((os.path.join("include", "crt", "host_config.h"), "nvidia-cuda-crt"),
                              (os.path.join("include", "cccl", "cuda", "std"), "nvidia-cuda-cccl")):
            if not os.path.exists(os.path.join(root, need)):
                problems.append(f"{os.path.join(root, need)} is missing (pip: {package})")
        if nvrtc and not under(nvrtc, root):
            problems.append(f"libnvrtc ({nvrtc}) is not under the header root {root}")
    if nvrtc and chosen and os.path.basename(nvrtc).split(".so.")[-1].split(".")[0] == "12" \
            and chosen[1] == "nvidia-cu13 wheels":
        problems.append(f"{nvrtc} is CUDA 12's, the headers CUDA 13's")
    if nvrtc is None:
        problems.append("no libnvrtc.so.* found (pip: nvidia-cuda-nvrtc)")
    if nccl is None:
        problems.append("no libnccl.so.* found (pip: nvidia-nccl-cu13)")
    return {
        "cuda_path": chosen[0] if chosen else None,
        "cuda_path_from": chosen[1] if chosen else None,
        "nvrtc": nvrtc,
        "nccl": nccl,
        "cublas": cublas,
        "problems": problems,
        "notes": notes,
    }


def site_roots_here():
    """The site-packages folders holding the `nvidia` namespace package, and
    torch's lib folder."""
    roots, extra = [], []
    try:
        import nvidia  # the namespace package of the CUDA wheels
        roots = [os.path.dirname(p) for p in nvidia.__path__]
    except ImportError:
        pass
    try:
        import torch
        extra.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
    except ImportError:
        pass
    return roots, extra


def library_env(work):
    """The environment for drove: CUDA_PATH and LD_LIBRARY_PATH from
    `choose_cuda`, with the `libnccl.so` / `libnvrtc.so` / `libcublas.so`
    names cudarc opens (the wheels ship sonames only) linked in work/lib, and
    each library's own folder on the path (libcublas loads libcublasLt from
    beside it)."""
    roots, extra = site_roots_here()
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    choice = choose_cuda(roots, nvcc=nvcc, cuda_path=os.environ.get("CUDA_PATH"), extra_lib_dirs=extra)
    links = os.path.join(work, "lib")
    os.makedirs(links, exist_ok=True)
    folders = []
    for link, target in (("libnccl.so", choice["nccl"]), ("libnvrtc.so", choice["nvrtc"]),
                         ("libcublas.so", choice.get("cublas"))):
        if target:
            dst = os.path.join(links, link)
            if os.path.lexists(dst):
                os.remove(dst)
            os.symlink(target, dst)
            folders.append(os.path.dirname(target))
    env = dict(os.environ)
    folders = list(dict.fromkeys(folders))
    env["LD_LIBRARY_PATH"] = ":".join([links] + folders + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    if choice["cuda_path"]:
        env["CUDA_PATH"] = choice["cuda_path"]
    return env, choice


def library_versions(choice):
    """NCCL's, NVRTC's and the driver's versions, read through ctypes."""
    out = {}
    try:
        v = ctypes.c_int()
        if choice["nccl"] is None:
            raise OSError("no libnccl was found")
        ctypes.CDLL(choice["nccl"]).ncclGetVersion(ctypes.byref(v))
        out["nccl"] = {"code": v.value, "version": f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}"}
    except (OSError, TypeError, AttributeError) as e:
        out["nccl"] = {"error": str(e)}
    try:
        major, minor = ctypes.c_int(), ctypes.c_int()
        if choice["nvrtc"] is None:
            raise OSError("no libnvrtc was found")
        ctypes.CDLL(choice["nvrtc"]).nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        out["nvrtc"] = f"{major.value}.{minor.value}"
    except (OSError, TypeError, AttributeError) as e:
        out["nvrtc"] = {"error": str(e)}
    try:
        v = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v))
        out["driver_cuda"] = f"{v.value // 1000}.{v.value % 1000 // 10}"
    except (OSError, AttributeError) as e:
        out["driver_cuda"] = {"error": str(e)}
    return out


# ---------------------------------------------------------------------------
# Running drove and reading what it printed.

class GpuMemory:
    """Peak memory.used of GPU 0 from `nvidia-smi -lms 100` while a phase runs."""

    def __init__(self):
        self.peak, self.base, self.proc = None, None, None

    def __enter__(self):
        self.base = gpu_used()
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0", "-lms", "100"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                v = int(line.strip())
            except ValueError:
                continue
            self.peak = v if self.peak is None else max(self.peak, v)

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def result(self):
        if self.peak is None:
            return None
        return {"peak_used_mib": self.peak, "idle_used_mib": self.base,
                "peak_over_idle_mib": self.peak - (self.base or 0)}


def gpu_used():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20)
        return int(out.stdout.strip())
    except Exception:
        return None


def json_lines(stdout):
    """The JSON objects a command printed, by rank: `drove run` prefixes each
    rank's lines with `[R] `; a process on its own is rank 0."""
    by_rank = {}
    for line in stdout.splitlines():
        rank = 0
        if line.startswith("[") and "] " in line:
            head, line = line[1:].split("] ", 1)
            if not head.isdigit():
                continue
            rank = int(head)
        if line.startswith("{"):
            try:
                by_rank[rank] = json.loads(line)
            except json.JSONDecodeError:
                continue
    return by_rank


def descendants(pid):
    """The processes below `pid` (children, theirs, ...), from /proc."""
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_bounded(cmd, env, cwd, timeout, grace=5.0):
    """Runs `cmd` in a session of its own; returns (exit code, stdout,
    stderr), the code None when it ran past `timeout`. Then its process group
    and every process below it (the ranks of `drove run` sit in groups of
    their own) get SIGTERM (`drove run` also passes it on to its ranks), and
    those still there after `grace` seconds SIGKILL, so that no rank is left
    holding the GPU while the next phase measures."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        pass
    family = [proc.pid] + descendants(proc.pid)

    def send(sig):
        for kill, target in [(os.killpg, proc.pid)] + [(os.kill, p) for p in family if alive(p)]:
            try:
                kill(target, sig)
            except (ProcessLookupError, PermissionError):
                pass
    send(signal.SIGTERM)
    end = time.time() + grace
    while time.time() < end and any(alive(p) for p in family):
        time.sleep(0.1)
    send(signal.SIGKILL)
    try:
        stdout, stderr = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:  # a pipe still held open by something we did not find
        stdout, stderr = "", ""
    return None, stdout or "", stderr or ""


def alive(pid):
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def json_objects(stdout):
    """Every JSON object a process on its own printed, in order (PyTorch's
    runs print one line each)."""
    found = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def run_command(report, phase, cmd, env, timeout, cwd=None):
    """Runs `cmd` under `timeout`; returns (exit code, stdout, stderr,
    seconds), the code None when it ran past its deadline (which is recorded),
    or None when it did not start (recorded too)."""
    if timeout < 5:
        report.error(phase, f"not run: {timeout:.0f} s left of the budget")
        return None
    log(f"{phase}: {' '.join(cmd)} (deadline {timeout:.0f} s)")
    started = time.time()
    try:
        code, stdout, stderr = run_bounded(cmd, env, cwd, timeout)
    except OSError as e:
        report.error(phase, f"could not start {cmd[0]}: {e}")
        return None
    took = time.time() - started
    if code is None:
        report.error(phase, f"did not finish within {timeout:.0f} s; stderr tail: {stderr[-2000:]}")
    return code, stdout, stderr, took


def run_json(report, phase, cmd, env, timeout, cwd=None, every_rank=False):
    """Runs `cmd`; returns the last JSON object rank 0 printed (every rank's,
    by rank, with `every_rank`), or None after recording why there is none.
    A command that printed its JSON and then failed (a check that did not
    hold) has the failure recorded and its JSON returned."""
    ran = run_command(report, phase, cmd, env, timeout, cwd)
    if ran is None or ran[0] is None:
        return None
    code, stdout, stderr, took = ran
    found = json_lines(stdout)
    if code != 0:
        report.error(phase, f"exit {code} after {took:.1f} s: {stderr.strip()[-3000:]}")
    if not found or 0 not in found:
        if code == 0:
            report.error(phase, f"printed no JSON (exit 0 after {took:.1f} s): {stderr.strip()[-2000:]}")
        return None
    value = {str(r): v for r, v in sorted(found.items())} if every_rank else found[0]
    value["phase_seconds"] = took
    value["exit_code"] = code
    return value


# `drove bench train`'s line for each step at RUST_LOG=drove_bench=debug.
STEP_LINE = re.compile(r"drove_bench::train: step step=(\d+) seconds=([0-9.eE+-]+) sentences_per_s=([0-9.eE+-]+)")


def steps_from_log(stderr, warmup, batch):
    """What a `drove bench train` cut at its deadline measured, from the step
    lines it logged (`STEP_LINE`): the steps after `warmup` summed up as its
    JSON would (sentences/s over the timed steps' total time, the median of
    the steps' sentences/s), marked `partial`; None when no step was timed."""
    steps = [(int(m.group(1)), float(m.group(2)), float(m.group(3))) for m in STEP_LINE.finditer(stderr)]
    timed = [(s, sps) for n, s, sps in steps if n > warmup]
    if not timed:
        return None
    seconds = sum(s for s, _ in timed)
    sentences = sum(s * sps for s, sps in timed)
    first = next((s for n, s, _ in steps if n == 1), None)
    return {"partial": True, "batch_size": batch, "steps_logged": len(steps), "steps_timed": len(timed),
            "first_step_seconds": first, "sentences_per_s": sentences / seconds if seconds else None,
            "median_sentences_per_s": statistics.median(sps for _, sps in timed),
            "step_mean_seconds": seconds / len(timed), "step_median_seconds": statistics.median(s for s, _ in timed)}


def under_run(drove, np, args):
    return [drove, "run", "--np", str(np), "--", drove] + args


# ---------------------------------------------------------------------------
# Parameters of two runs, compared as the CPU tests compare them.

def read_checkpoint(out_dir):
    """{name: bytes} of the f32 tensors of the checkpoint `latest` names."""
    root = os.path.join(out_dir, "checkpoints")
    latest = open(os.path.join(root, "latest")).read().strip()
    with open(os.path.join(root, latest, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta.get("dtype") != "F32":
            continue
        start, end = meta["data_offsets"]
        tensors[name] = data[start:end]
    return tensors


def relative_difference(a, b):
    """Largest absolute difference over the largest absolute value, over every
    tensor (tests/common's `relative_difference`)."""
    if sorted(a) != sorted(b):
        raise ValueError(f"the checkpoints hold different tensors: {sorted(set(a) ^ set(b))[:5]}")
    try:
        import numpy as np
        diff = scale = 0.0
        for name in a:
            x, y = np.frombuffer(a[name], dtype="<f4"), np.frombuffer(b[name], dtype="<f4")
            diff = max(diff, float(np.max(np.abs(x - y))) if x.size else 0.0)
            scale = max(scale, float(np.max(np.abs(x))) if x.size else 0.0)
    except ImportError:
        from array import array
        diff = scale = 0.0
        for name in a:
            x, y = array("f", a[name]), array("f", b[name])
            diff = max([diff] + [abs(p - q) for p, q in zip(x, y)])
            scale = max([scale] + [abs(p) for p in x])
    return diff / scale if scale else float("inf")


# The losses and gradient norms of two runs' steps may lie this far apart
# (relative): the order of the sums moves them by far less, and a gradient of
# the wrong scale (a sum for an average, a lost 1/world) by a half or more.
SCALE_BOUND = 1e-4


def scale_difference(a, b):
    """The largest relative difference between two runs' `step_scales` (each
    step's global loss and gradient norm before clipping, from `--json`'s
    summary), which see a gradient's scale where the parameters after clipping
    and AdamW do not."""
    if not a or not b or len(a) != len(b):
        raise ValueError(f"the runs report {len(a or [])} and {len(b or [])} steps' scales")
    worst = 0.0
    for x, y in zip(a, b):
        for key in ("global_loss", "grad_norm"):
            p, q = float(x[key]), float(y[key])
            if not (p > 0 and q > 0):
                raise ValueError(f"step {x.get('step')}: {key} {p} and {q} are not both positive")
            worst = max(worst, abs(p - q) / max(p, q))
    return worst


# The flags of the 4-against-1 comparison: gradients staged through the host,
# matmuls in f32 (no TF32 rounding that differs with the batch's shape).
EQUIVALENCE_FLAGS = ("--gradient-path", "host", "--matmul", "drove", "--matmul-precision", "f32")


def equivalence_commands(drove, data, model, work, world, extra=(), init=()):
    """The two runs of `train_equivalence`: (one rank's command, its out
    folder, `world` ranks' command under `drove run`, their out folder)."""
    small = ["train", "ner", "--device", "cuda:0", "--data", data, "--model", model, "--max-train-sentences", "16",
             "--epochs", "5", "--dropout", "0", "--eval", "", "--lr-scaling", "none", "--lr", "1e-3",
             "--warmup", "0", "--micro-batches", "1", "--json"] + list(extra) + list(init)
    tag = "-".join(a.lstrip("-") for a in extra)
    one = os.path.join(work, "equivalence" + (f"-{tag}" if tag else "") + "-1")
    many = os.path.join(work, "equivalence" + (f"-{tag}" if tag else "") + f"-{world}")
    return ([drove] + small + ["--batch-size", "16", "--out", one], one,
            under_run(drove, world, small + ["--batch-size", str(16 // world), "--out", many]), many)


def train_equivalence(report, drove, data, model, env, work, world, deadline_one, deadline_many,
                      extra=(), init=(), name="train equivalence"):
    """`world` ranks on one GPU (batch 16 / world each) against world 1 (batch
    16), with the flags `extra` on both (e.g. `EQUIVALENCE_FLAGS`) and
    `init` (`--random-init` where the weights did not travel): the parameters
    after 5 steps (16 sentences, 5 epochs) must agree within 1e-5 relative,
    and every step's loss and gradient norm within SCALE_BOUND.
    `deadline_one()` and `deadline_many()` give each run's seconds when it starts."""
    cmd_one, one, cmd_many, many = equivalence_commands(drove, data, model, work, world, extra, init)
    for d in (one, many):
        shutil.rmtree(d, ignore_errors=True)  # a checkpoint of an earlier try would be read as this one's
    result = {"steps": 5, "bound": 1e-5, "world": world, "batch_per_rank": 16 // world, "flags": list(extra),
              "random_init": bool(init)}
    result["world1"] = run_json(report, f"{name} world 1", cmd_one, env, deadline_one())
    result[f"world{world}"] = run_json(report, f"{name} world {world}", cmd_many, env, deadline_many())
    if result["world1"] and result[f"world{world}"]:
        try:
            d = relative_difference(read_checkpoint(one), read_checkpoint(many))
            result["relative_difference"] = d
            result["within_bound"] = d < 1e-5
            if d >= 1e-5:
                report.error(name, f"world {world} differs from world 1 by {d:e} (relative) after 5 steps")
        except (OSError, ValueError, KeyError) as e:
            report.error(name, f"comparing the checkpoints: {e}")
        try:
            s = scale_difference(result["world1"].get("step_scales"), result[f"world{world}"].get("step_scales"))
            result["scale_difference"] = s
            result["scale_within_bound"] = s < SCALE_BOUND
            if s >= SCALE_BOUND:
                report.error(name, f"world {world}'s losses or gradient norms differ from world 1's by {s:e}")
        except (ValueError, KeyError, TypeError) as e:
            report.error(name, f"comparing the steps' losses and gradient norms: {e}")
    return result


# ---------------------------------------------------------------------------
# The diversity story on four ranks of the one GPU.

STORY_WORLD = 4
STORY_BATCH = 32
STORY_STEPS = 12
STORY_MASK = 0.15


def story_args(seeding, data, model, out, init=(), gradient_path=None):
    """`drove train ner`'s flags for one run of the story: 12 steps of 4 ranks
    of 32 on one epoch of exactly that many sentences, diagnosed every 5; the
    gradient path left to `auto` (as the README launches it) unless given."""
    path = ["--gradient-path", gradient_path] if gradient_path else []
    return ["train", "ner", "--device", "cuda:0"] + path + ["--augment-mask", str(STORY_MASK),
            "--seeding", seeding, "--diagnose-every", "5", "--max-steps", str(STORY_STEPS), "--epochs", "1",
            "--batch-size", str(STORY_BATCH), "--max-train-sentences", str(STORY_WORLD * STORY_BATCH * STORY_STEPS),
            "--eval", "", "--json", "--out", out, "--data", data, "--model", model] + list(init)


def story_run(seeding, summary):
    """One run of the story read from `drove train ner --json`'s summary
    (NerSummary: `mask_agreement` is drove-collate's AgreementReport, null
    when no step was diagnosed; `diversity_alarm` the alarm's text or null):
    naive seeding passes with agreement 1.0, the verdict `identical` and the
    alarm; derived seeding with agreement within 3 sigma of the expected
    p^2+(1-p)^2, the verdict `diverse` and no alarm."""
    if not isinstance(summary, dict):
        return {"seeding": seeding, "pass": False, "why": "the run gave no summary (see errors)"}
    a = summary.get("mask_agreement")
    alarm = summary.get("diversity_alarm")
    out = {"seeding": seeding, "alarm": alarm, "exit_code": summary.get("exit_code"),
           "steps": summary.get("steps"), "world_size": summary.get("world_size")}
    if not isinstance(a, dict):
        out.update({"agreement": None, "pass": False, "why": "no step was diagnosed (mask_agreement is null)"})
        return out
    mean, expected, sigma = a.get("mean_agreement"), a.get("expected"), a.get("sigma")
    z = (mean - expected) / sigma if None not in (mean, expected, sigma) and sigma > 0 else None
    out.update({"agreement": mean, "expected": expected, "sigma": sigma, "z": z,
                "within_3_sigma": a.get("within_3_sigma"), "verdict": a.get("verdict"),
                "diagnosed_steps": a.get("steps"), "world_size": a.get("world_size", out["world_size"])})
    if mean is None:
        out.update({"pass": False, "why": "no agreement was measured (NaN: no positions compared)"})
    elif seeding == "naive":
        ok = abs(mean - 1.0) < 1e-9 and a.get("verdict") == "identical" and isinstance(alarm, str)
        out["pass"] = ok
        if not ok:
            out["why"] = "naive seeding should agree 1.0 with the verdict identical and the alarm"
    else:
        within = z is not None and abs(z) <= 3.0
        ok = within and a.get("verdict") == "diverse" and alarm is None
        out["pass"] = ok
        if not ok:
            out["why"] = "derived seeding should lie within 3 sigma of the expected agreement, diverse, no alarm"
    return out


def story_verdict(naive, derived, skipped=None):
    """Both runs of the story (their summaries, or None) and whether it holds."""
    if skipped:
        return {"pass": None, "why": skipped}
    runs = {"naive": story_run("naive", naive), "derived": story_run("derived", derived)}
    return {"world": STORY_WORLD, "batch_per_rank": STORY_BATCH, "steps": STORY_STEPS, "mask_probability": STORY_MASK,
            "diagnose_every": 5, **runs, "pass": runs["naive"]["pass"] and runs["derived"]["pass"]}


# ---------------------------------------------------------------------------
# The command lines, built in one place for the run and the dry run.

def step_flags(config, **override):
    """`drove bench train`'s flags of the configuration `config` (a key of
    STEP_CONFIGS), with `override` (`prewarm="off"`: `--prewarm off`)."""
    flags = dict(STEP_CONFIGS[config])
    for name, value in override.items():
        flag = "--" + name.replace("_", "-")
        if flag not in flags:
            raise KeyError(f"{flag} is not a switch of the step configurations")
        flags[flag] = value
    return [x for pair in flags.items() for x in pair]


def drove_bench(drove, batch, steps, warmup, config, kcache, data_model, init=(), extra=(), device="cuda",
                **override):
    """`drove bench train --json` at `batch` with the flags of `config`."""
    return ([drove, "bench", "train", "--device", device, "--json", "--batch-size", str(batch),
             "--steps", str(steps), "--warmup-steps", str(warmup), "--bucket-window", str(BUCKET_WINDOW),
             "--kernel-cache", kcache] + step_flags(config, **override) + list(extra) + list(data_model) + list(init))


def pytorch_bench(python, script, batches, steps, warmup, data_model, init=()):
    """pytorch_ner.py's throughput runs: every batch size in `batches` with
    eager f32 and fused AdamW, then each again with TF32 allowed, in one
    process (one JSON line a run)."""
    return ([python, script, "--device", "cuda", "--fused-adamw", "--batch-size", ",".join(map(str, batches)),
             "--tf32", "both", "--steps", str(steps), "--warmup-steps", str(warmup),
             "--bucket-window", str(BUCKET_WINDOW)] + list(data_model) + list(init))


def matmul_bench(drove, budget_s, repeats=5, device="cuda"):
    """`drove bench matmul --json`: no new shape after `budget_s`."""
    return [drove, "bench", "matmul", "--device", device, "--json", "--budget-s", f"{budget_s:.0f}",
            "--repeats", str(repeats)]


def bench_key(batch, config):
    return f"drove_b{batch}_{config}"


def pytorch_key(batch, tf32):
    return f"pytorch_b{batch}_{'tf32' if tf32 else 'f32'}"


def planned_commands(drove, python, script, data, model, work, kcache, init=()):
    """Every command the check runs, by phase, in its order: what the dry run
    parses and what `main` runs (batch 256 with fewer steps where its deadline
    says so, built by the same `drove_bench`)."""
    data_model = ["--data", data, "--model", model]
    cmds = {"host_floor": drove_bench(drove, HOST_FLOOR["batch"], HOST_FLOOR["steps"], HOST_FLOOR["warmup"],
                                      "all_steps", kcache, data_model, init),
            "pytorch": pytorch_bench(python, script, BATCHES, STEPS, WARMUP, data_model, init)}
    for config in CONFIG_ORDER:
        for batch in BATCHES:
            cmds[bench_key(batch, config)] = drove_bench(drove, batch, STEPS, WARMUP, config, kcache, data_model, init)
    cmds["launches"] = drove_bench(drove, LAUNCHES["batch"], LAUNCHES["steps"], LAUNCHES["warmup"], "all_steps",
                                   kcache, data_model, init, extra=["--count-launches"], prewarm="off")
    cmds["profile_b256"] = drove_bench(drove, PROFILE["batch"], PROFILE["steps"], PROFILE["warmup"], "all_steps",
                                       kcache, data_model, init, prewarm="off")
    cmds["matmul"] = matmul_bench(drove, 15)
    one, _, many, _ = equivalence_commands(drove, data, model, work, 4, EQUIVALENCE_FLAGS, init)
    cmds["equivalence_world1"], cmds["equivalence_world4"] = one, many
    for seeding in ("naive", "derived"):
        cmds[f"story_{seeding}"] = under_run(drove, STORY_WORLD,
                                             story_args(seeding, data, model, os.path.join(work, f"story-{seeding}"),
                                                        init))
    cmds["nccl"] = [drove, "bench", "nccl", "--json", "--sizes", "64MiB"]
    cmds["in_place"] = [drove, "bench", "nccl", "--buckets", "--json"]
    cmds["in_place_world2"] = under_run(drove, 2, ["bench", "nccl", "--buckets", "--gpu", "0", "--json"])
    one, _, many, _ = equivalence_commands(drove, data, model, work, 2, (), init)
    cmds["equivalence_world2_1"], cmds["equivalence_world2_2"] = one, many
    cmds["f1_drove"] = [drove, "train", "ner", "--device", "cuda", "--epochs", "1", "--eval", "test", "--json",
                        "--out", os.path.join(work, "run"), "--data", data, "--model", model]
    cmds["f1_pytorch"] = [python, script, "--device", "cuda", "--epochs", "1", "--data", data, "--model", model]
    return cmds


def parse_check(cmd, drove, local_drove, python, script, local_script):
    """The command that makes the local tools parse `cmd`'s flags, or None
    where `cmd` is not one of the check's: drove's subcommands with `--help`
    after every flag (clap reads each flag and value before it acts on
    `--help`: an unknown flag or value fails, exit 2), the program under
    `drove run` alike, pytorch_ner.py with `--check-args`."""
    if cmd[0] == drove:
        if cmd[1] == "run" and "--" in cmd:
            inner = cmd[cmd.index("--") + 1:]
            if inner[0] != drove:
                return None
            return [[local_drove] + cmd[1:cmd.index("--")] + ["--help"], [local_drove] + inner[1:] + ["--help"]]
        return [[local_drove] + cmd[1:] + ["--help"]]
    if cmd[0] == python and cmd[1] == script:
        return [[sys.executable, local_script] + cmd[2:] + ["--check-args"]]
    return None


# ---------------------------------------------------------------------------
# cubecl's profiling log.

def profile_config(log_path):
    """cubecl.toml for a profiled run: every kernel timed (`basic`: cubecl 0.10's
    ProfilingLogLevel, a line `| DURATION | NAME` each) into `log_path`."""
    return f'[profiling.logger]\nlevel = "basic"\nfile = {json.dumps(log_path)}\nappend = false\n'


DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ns|µs|us|ms|s)$")
UNIT_S = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_duration(text):
    """Seconds of a Rust `Duration` as `{:?}` prints it (`8.63ms`, `501µs`,
    `1.5s`, `120ns`), or None."""
    m = DURATION.match(text.strip())
    return float(m.group(1)) * UNIT_S[m.group(2)] if m else None


def profile_ranking(text, steps, top=PROFILE_TOP):
    """cubecl's profiling log (`| 8.63ms     | NAME`, one line a kernel
    launched; its summary tables are skipped) summed up by kernel name and
    ranked by `count x median`, which leaves out the first launch's compile
    that a total carries; per step over `steps` (the log spans the whole run,
    loading and untimed steps included: a kernel run fewer times than there
    were steps ran outside them)."""
    by_name = {}
    for line in text.splitlines():
        if not line.startswith("| "):
            continue
        head, sep, name = line[2:].partition(" | ")
        seconds = parse_duration(head) if sep else None
        if seconds is None:
            continue
        by_name.setdefault(name.strip(), []).append(seconds)
    rows = []
    for name, times in by_name.items():
        med = statistics.median(times)
        rows.append({"kernel": name, "count": len(times), "total_ms": 1e3 * sum(times), "median_us": 1e6 * med,
                     "ranked_ms": 1e3 * med * len(times)})
    rows.sort(key=lambda r: -r["ranked_ms"])
    ranked = sum(r["ranked_ms"] for r in rows)
    for r in rows:
        r["per_step_ms"] = r["ranked_ms"] / steps if steps else None
        r["share"] = r["ranked_ms"] / ranked if ranked else None
    return {"kernels_launched": sum(r["count"] for r in rows), "distinct_kernels": len(rows), "steps": steps,
            "ranked_ms": ranked, "ranked_ms_per_step": ranked / steps if steps else None,
            "total_ms": sum(r["total_ms"] for r in rows), "top": rows[:top]}


# ---------------------------------------------------------------------------
# The matmul sweep, summed up.

def matmul_summary(report):
    """Each shape of `drove bench matmul`'s JSON: the fastest cubek kernel that
    matched its reference (and the fastest at f32) beside cuBLAS's sgemm and
    TF32, and their ratios (cubek's time over cuBLAS's: above 1 is slower)."""
    if not isinstance(report, dict):
        return None
    shapes = {}
    for row in report.get("rows", []):
        key = (row.get("class"), row.get("sentences"), row.get("seq"))
        shapes.setdefault(key, []).append(row)
    out = []
    for (cls, sentences, seq), rows in shapes.items():
        ok = [r for r in rows if r.get("mean_us") and r.get("matched") and not r.get("error")]
        cubek = [r for r in ok if not str(r.get("strategy", "")).startswith("cublas")]
        best = min(cubek, key=lambda r: r["mean_us"], default=None)
        best_f32 = min((r for r in cubek if r.get("precision") == "f32"), key=lambda r: r["mean_us"], default=None)
        lib = {r["strategy"]: r["mean_us"] for r in ok if str(r.get("strategy", "")).startswith("cublas")}
        entry = {"class": cls, "sentences": sentences, "seq": seq,
                 "best": best and {"strategy": best["strategy"], "mean_us": best["mean_us"], "tflops": best.get("tflops")},
                 "best_f32": best_f32 and {"strategy": best_f32["strategy"], "mean_us": best_f32["mean_us"]},
                 "cublas_sgemm_us": lib.get("cublas_sgemm"), "cublas_tf32_us": lib.get("cublas_tf32"),
                 "failed": sorted(r.get("strategy") for r in rows if r.get("error"))}
        entry["best_over_cublas_tf32"] = (best["mean_us"] / lib["cublas_tf32"]
                                          if best and lib.get("cublas_tf32") else None)
        entry["best_f32_over_cublas_sgemm"] = (best_f32["mean_us"] / lib["cublas_sgemm"]
                                               if best_f32 and lib.get("cublas_sgemm") else None)
        out.append(entry)
    return {"shapes": out, "shapes_skipped": report.get("skipped"), "cublas": report.get("cublas")}


# ---------------------------------------------------------------------------
# What the phases measured, summed up.

def sentences_per_s(run):
    return run.get("sentences_per_s") if isinstance(run, dict) else None


def median_sentences_per_s(run):
    return run.get("median_sentences_per_s") if isinstance(run, dict) else None


def ratio(ours, theirs):
    """drove's sentences/s over PyTorch's (means over the timed steps: total
    work over total time), or None where either is missing."""
    a, b = sentences_per_s(ours), sentences_per_s(theirs)
    return a / b if a and b else None


def median_ratio(ours, theirs):
    """The same over each run's median step."""
    a, b = median_sentences_per_s(ours), median_sentences_per_s(theirs)
    return a / b if a and b else None


def mean_over_median(run):
    """A run's mean step over its median step (from sentences/s: the mean
    step is a batch over the mean sentences/s), or None."""
    mean, med = sentences_per_s(run), median_sentences_per_s(run)
    return med / mean if mean and med else None


def mean_near_median(run, tolerance=MEAN_MEDIAN_TOLERANCE):
    """Whether a run's mean step lies within `tolerance` of its median."""
    r = mean_over_median(run)
    return None if r is None else abs(r - 1.0) <= tolerance


def fit_steps(requested, warmup, batch, deadline_s, reference, minimum=20, margin=0.8):
    """Steps at `batch` that fit in `deadline_s`, estimated from `reference`
    (drove bench train's JSON at another batch): a step as long as `batch`
    sentences took there (no gain from the larger batch assumed), the
    reference's untimed time (loading, compiling, its warm-up steps) again,
    with `margin` of the deadline. Returns (steps, why or None): `requested`
    where it fits or nothing is known, never below `minimum`."""
    sps = sentences_per_s(reference)
    if not sps:
        return requested, None
    step_s = batch / sps
    wall, mean, timed = (reference.get(k) for k in ("wall_seconds_including_load", "step_mean_seconds", "steps_timed"))
    overhead = wall - mean * timed if None not in (wall, mean, timed) else 30.0
    fits = int((margin * deadline_s - overhead) / step_s) - warmup
    if fits >= requested:
        return requested, None
    steps = max(minimum, fits)
    return steps, (f"{requested} steps would not fit {deadline_s:.0f} s: a step of {batch} estimated at "
                   f"{step_s:.2f} s from {sps:.0f} sentences/s, {overhead:.0f} s untimed")


def first_step_summary(cold, warm, target=WARM_FIRST_STEP_TARGET_S):
    """The first step with an empty kernel cache beside the first with the
    cache the cold run filled, and the warm one's target."""
    def get(run, key):
        return run.get(key) if isinstance(run, dict) else None
    warm_s = get(warm, "first_step_seconds")
    return {"first_step_cold_s": get(cold, "first_step_seconds"), "first_step_warm_s": warm_s,
            "target_warm_s": target, "warm_met": (warm_s < target) if warm_s is not None else None,
            "kernels_compiled_cold": get(cold, "kernels_compiled"),
            "kernels_compiled_warm": get(warm, "kernels_compiled"),
            "kernel_cache": get(cold, "kernel_cache")}


def peak_mib(run):
    """The sampled peak GPU memory of a run over the idle memory (MiB)."""
    if not isinstance(run, dict) or not isinstance(run.get("gpu_memory_sampled"), dict):
        return None
    return run["gpu_memory_sampled"].get("peak_over_idle_mib")


def pytorch_mib(run):
    """What a PyTorch run held on the GPU at its peak (MiB): its CUDA context
    and the most its caching allocator reserved (the runs share a process, so
    nvidia-smi's peak is the largest run's)."""
    if not isinstance(run, dict) or run.get("gpu_max_memory_reserved_bytes") is None:
        return None
    return (run["gpu_max_memory_reserved_bytes"] + (run.get("cuda_context_bytes") or 0)) / 2**20


def comparison(ours, theirs):
    """One drove run against one PyTorch run."""
    return {"ratio_mean": ratio(ours, theirs), "ratio_median": median_ratio(ours, theirs),
            "drove_sentences_per_s": sentences_per_s(ours), "pytorch_sentences_per_s": sentences_per_s(theirs),
            "drove_median_sentences_per_s": median_sentences_per_s(ours),
            "pytorch_median_sentences_per_s": median_sentences_per_s(theirs),
            "drove_steps_timed": ours.get("steps_timed") if isinstance(ours, dict) else None,
            "pytorch_steps_timed": theirs.get("steps_timed") if isinstance(theirs, dict) else None,
            "drove_partial": bool(ours.get("partial")) if isinstance(ours, dict) else None}


def targets(data):
    """Each target beside what was measured (`met` is null where it was not),
    and every configuration against both PyTorch runs."""
    out = {}
    for batch in BATCHES:
        ours, theirs = data.get(bench_key(batch, "all_steps")), data.get(pytorch_key(batch, False))
        r = ratio(ours, theirs)
        out[f"b{batch}_all_steps_over_pytorch_f32"] = {
            "target": f"drove (every step on) / PyTorch eager f32 + fused AdamW, sentences/s means >= "
                      f"{RATIO_TARGETS[batch]}", "goal": 1.0, **comparison(ours, theirs),
            "met": None if r is None else r >= RATIO_TARGETS[batch]}
    near = {"target": f"a run's mean step within {MEAN_MEDIAN_TOLERANCE:.0%} of its median"}
    for key in sorted(data):
        if key.startswith(("drove_b", "pytorch_b", "host_floor")) and isinstance(data[key], dict):
            near[key] = {"mean_over_median": mean_over_median(data[key]), "met": mean_near_median(data[key])}
    wanted = [near.get(bench_key(b, "all_steps"), {}).get("met") for b in BATCHES]
    near["met"] = None if None in wanted else all(wanted)
    out["mean_within_5pct_of_median"] = near
    memory = {"how": "drove: nvidia-smi's peak over idle, every 100 ms; PyTorch: its CUDA context plus the most "
                     "its allocator reserved (max_memory_reserved)"}
    for batch in BATCHES:
        ours, theirs = peak_mib(data.get(bench_key(batch, "all_steps"))), pytorch_mib(data.get(pytorch_key(batch, False)))
        memory[f"b{batch}"] = {"drove_mib": ours, "pytorch_mib": theirs,
                               "drove_over_pytorch": ours / theirs if ours and theirs else None}
    out["peak_memory"] = memory
    out["comparisons"] = {
        f"b{batch}_{config}": {"flags": step_flags(config),
                               "vs_pytorch_f32": comparison(data.get(bench_key(batch, config)),
                                                            data.get(pytorch_key(batch, False))),
                               "vs_pytorch_tf32": comparison(data.get(bench_key(batch, config)),
                                                             data.get(pytorch_key(batch, True)))}
        for batch in BATCHES for config in CONFIG_ORDER}
    transfers = {"target": "one blocking read a step at world 1 (issue 49 step 4), uploads 6 or fewer"}
    for key in [bench_key(b, c) for b in BATCHES for c in CONFIG_ORDER] + ["launches"]:
        run = data.get(key)
        if isinstance(run, dict) and isinstance(run.get("transfers_per_step"), dict):
            transfers[key] = run["transfers_per_step"]
    counted = data.get("launches") if isinstance(data.get("launches"), dict) else {}
    t = counted.get("transfers_per_step")
    transfers["met"] = None if not isinstance(t, dict) else (t.get("max_reads") == 1 and t.get("max_uploads", 99) <= 6)
    transfers["kernels_launched_per_step"] = counted.get("kernels_launched_per_step")
    out["transfers"] = transfers
    host = data.get("host_floor")
    out["host_floor"] = {"batch": HOST_FLOOR["batch"],
                         "step_median_seconds": (HOST_FLOOR["batch"] / median_sentences_per_s(host)
                                                 if median_sentences_per_s(host) else None),
                         "step_mean_seconds": host.get("step_mean_seconds") if isinstance(host, dict) else None}
    warm = counted.get("first_step_seconds")
    out["warm_first_step"] = {"target_s": WARM_FIRST_STEP_TARGET_S, "seconds": warm,
                              "met": None if warm is None else warm < WARM_FIRST_STEP_TARGET_S}
    goals = [out[f"b{b}_all_steps_over_pytorch_f32"]["met"] for b in BATCHES] + [near["met"]]
    out["all_met"] = None if None in goals else all(goals)
    return out


def folder_size(path):
    """(files, bytes) under `path`."""
    files = size = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                size += os.path.getsize(os.path.join(root, n))
                files += 1
            except OSError:
                pass
    return files, size


# ---------------------------------------------------------------------------
# The phases that need more than one command's JSON.

# `drove bench train`'s step lines on stderr (for `steps_from_log`).
BENCH_LOG = "info,drove_bench=debug,wgpu_hal=off"


def measured(report, key, cmd, env, timeout, batch, warmup, cwd=None):
    """Runs one `drove bench train` with the GPU memory sampled and records its
    JSON under `key`; one cut at its deadline (or that printed none) is
    recorded from the steps it logged (`steps_from_log`, `partial`)."""
    with GpuMemory() as mem:
        ran = run_command(report, key, cmd, {**env, "RUST_LOG": BENCH_LOG}, timeout, cwd)
    value = None
    if ran is not None:
        code, stdout, stderr, took = ran
        value = json_lines(stdout).get(0)
        if code not in (0, None):
            report.error(key, f"exit {code} after {took:.1f} s: {stderr.strip()[-3000:]}")
        if value is None:
            if code == 0:
                report.error(key, f"printed no JSON (exit 0 after {took:.1f} s): {stderr.strip()[-2000:]}")
            value = steps_from_log(stderr, warmup, batch)
        if value is not None:
            value.update({"phase_seconds": took, "exit_code": code, "gpu_memory_sampled": mem.result()})
    report.set(key, value)
    return value


def profile_phase(report, key, cmd, env, timeout, folder, log_out, steps, batch, warmup):
    """`cmd` (a `drove bench train`) run in `folder` beside a cubecl.toml that
    times every kernel into a log; records the run under `key` and the
    ranking (`profile_ranking`) under `key`_ranking; the log is kept,
    compressed, at `log_out` (.xz)."""
    os.makedirs(folder, exist_ok=True)
    log_path = os.path.join(folder, "profile.log")
    if os.path.exists(log_path):
        os.remove(log_path)
    with open(os.path.join(folder, "cubecl.toml"), "w") as f:
        f.write(profile_config(log_path))
    measured(report, key, cmd, env, timeout, batch, warmup, cwd=folder)
    if not os.path.exists(log_path):
        report.error(key, f"cubecl wrote no profiling log at {log_path}")
        report.set(f"{key}_ranking", None)
        return None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    with lzma.open(log_out, "wt", encoding="utf-8") as f:
        f.write(text)
    ranking = profile_ranking(text, steps)
    ranking["log"] = log_out
    ranking["timing"] = ("cubecl's profiling (basic): each kernel between two syncs; on CUDA by the host clock "
                         "(launch latency in, overlap out); ranked by count x median (first-launch compiles out)")
    report.set(f"{key}_ranking", ranking)
    return ranking


def run_pytorch(report, cmd, env, timeout):
    """pytorch_ner.py's runs, one JSON line each (kept from a run cut at its
    deadline too), recorded by batch size and TF32 (`pytorch_key`)."""
    with GpuMemory() as mem:
        ran = run_command(report, "pytorch", cmd, env, timeout)
    if ran is None:
        return []
    code, stdout, stderr, took = ran
    runs = json_objects(stdout)
    if code not in (0, None):
        report.error("pytorch", f"exit {code} after {took:.1f} s: {stderr.strip()[-3000:]}")
    if not runs and code == 0:
        report.error("pytorch", f"printed no JSON (exit {code} after {took:.1f} s): {stderr.strip()[-2000:]}")
    for run in runs:
        report.set(pytorch_key(run.get("batch_size"), run.get("tf32")), run)
    report.set("pytorch_process", {"phase_seconds": took, "exit_code": code, "runs": len(runs),
                                   "gpu_memory_sampled": mem.result()})
    return runs


# ---------------------------------------------------------------------------

def dry_run(local_drove, local_script, wgpu_data=None, wgpu_model=None):
    """Every command line of the check parsed by the local tools
    (`parse_check`), for real weights and for random ones; with `wgpu_data`
    and `wgpu_model`, the profile phase run for real on `--device wgpu`.
    Returns the number of failures."""
    failures = 0
    local_drove, local_script = os.path.abspath(local_drove), os.path.abspath(local_script)
    with tempfile.TemporaryDirectory() as tmp:
        for init in ((), ("--random-init",)):
            cmds = planned_commands("DROVE", "PYTHON", "SCRIPT", os.path.join(tmp, "data"),
                                    os.path.join(tmp, "model"), os.path.join(tmp, "work"),
                                    os.path.join(tmp, "kcache"), init)
            for phase, cmd in cmds.items():
                checks = parse_check(cmd, "DROVE", local_drove, "PYTHON", "SCRIPT", local_script)
                if checks is None:
                    print(f"dry run: {phase}: not a command the dry run knows: {cmd}")
                    failures += 1
                    continue
                for check in checks:
                    out = subprocess.run(check, capture_output=True, text=True, timeout=120)
                    shown = " ".join(check[1:])
                    if out.returncode != 0:
                        failures += 1
                        print(f"dry run: {phase}{' ' + init[0] if init else ''}: FAILED (exit {out.returncode}): "
                              f"{shown}\n{out.stderr.strip()[-1500:]}")
                    else:
                        print(f"dry run: {phase}{' ' + init[0] if init else ''}: ok")
        if wgpu_data and wgpu_model:
            report = Report(os.path.join(tmp, "dry-run.json"))
            env = {**os.environ, "LP_NUM_THREADS": os.environ.get("LP_NUM_THREADS", "1")}
            cmd = drove_bench(local_drove, 2, 2, 1, "all_steps", "off",
                              ["--data", os.path.abspath(wgpu_data), "--model", os.path.abspath(wgpu_model)],
                              ["--random-init"], device="wgpu", prewarm="off")
            ranking = profile_phase(report, "profile_wgpu", cmd, env, 300, os.path.join(tmp, "profile"),
                                    os.path.join(tmp, "profile.log.xz"), 3, 2, 1)
            run = report.data.get("profile_wgpu")
            if not ranking or not ranking["top"] or not isinstance(run, dict) or run.get("partial"):
                failures += 1
                print(f"dry run: profile on wgpu: FAILED: {json.dumps(report.data)[-3000:]}")
            else:
                print(f"dry run: profile on wgpu: ok, {ranking['kernels_launched']} kernels launched, "
                      f"{ranking['distinct_kernels']} distinct; the first: "
                      + "; ".join(f"{r['kernel']} {r['ranked_ms']:.2f} ms" for r in ranking["top"][:3]))
    print(f"dry run: {'every command parses' if not failures else f'{failures} failed'}")
    return failures


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description="The GPU check's run (see the module's docstring).")
    ap.add_argument("--pack", help="the unpacked pack (gpu-check.sh's folder)")
    ap.add_argument("--out", help="where gpu-check.json and the profile log go")
    ap.add_argument("--work", help="where the pack is unpacked and the runs write (default: "
                                   "$TMPDIR/drove-gpu-check, outside --out, so that it does not come back)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    ap.add_argument("--dry-run", action="store_true",
                    help="parse every command line with --drove and --script here, run nothing on a GPU")
    ap.add_argument("--drove", help="with --dry-run: the drove binary that parses drove's command lines")
    script_default = next((p for p in (os.path.join(here, "pytorch_ner.py"),
                                       os.path.join(here, "..", "bench", "pytorch_ner.py")) if os.path.exists(p)),
                          None)
    ap.add_argument("--script", default=script_default, help="with --dry-run: pytorch_ner.py")
    ap.add_argument("--wgpu-data", help="with --dry-run: CoNLL-2003 files for a profiled run on --device wgpu")
    ap.add_argument("--wgpu-model", help="with --dry-run: a model folder for that run (random weights)")
    args = ap.parse_args()
    if args.dry_run:
        if not args.drove or not args.script:
            ap.error("--dry-run needs --drove (and --script where pytorch_ner.py is not found)")
        sys.exit(1 if dry_run(args.drove, args.script, args.wgpu_data, args.wgpu_model) else 0)
    if not args.pack or not args.out:
        ap.error("--pack and --out are needed (or --dry-run)")
    run_check(args)


def run_check(args):
    t0 = time.time()
    left = lambda: args.budget - (time.time() - t0)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    report = Report(os.path.join(out, "gpu-check.json"), summary=targets)
    report.set("budget_s", args.budget)
    work = os.path.abspath(args.work or os.path.join(tempfile.gettempdir(), "drove-gpu-check"))
    shutil.rmtree(work, ignore_errors=True)
    report.set("work", work)
    drove, data, model = unpack(args.pack, work)
    meta = json.load(open(os.path.join(args.pack, "pack.json")))
    report.set("pack", meta)
    real = meta["weights"] == "real"
    if real:
        f16 = os.path.join(model, "model.f16.safetensors")
        done = subprocess.run([drove, "weights", f16, os.path.join(model, "model.safetensors"), "--to", "f32"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            report.error("weights", done.stderr)
            real = False
        os.remove(f16)
    env, choice = library_env(work)
    versions = library_versions(choice)
    report.set("toolchain", {**choice, **versions})
    for p in choice["problems"]:
        report.error("toolchain", p)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        report.set("device", smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None)
        if smi.returncode != 0:
            report.error("device", smi.stderr)
    except (OSError, subprocess.TimeoutExpired, IndexError) as e:
        report.set("device", None)
        report.error("device", f"nvidia-smi: {e}")
    report.set("ncu", shutil.which("ncu"))
    report.set("setup_seconds", time.time() - t0)

    # One kernel cache for every drove run, new for the first one: the flag for
    # `drove bench train`, the variable for the others (`drove train ner`).
    kcache = os.path.join(work, "kcache")
    shutil.rmtree(kcache, ignore_errors=True)
    env["DROVE_KERNEL_CACHE"] = kcache
    deadlines = {}

    def deadline(phase):
        d = phase_deadline(phase, left())
        deadlines[phase] = {"deadline_s": round(d, 1), "started_at_s": round(time.time() - t0, 1)}
        report.data["deadlines"] = deadlines
        return d

    init = [] if real else ["--random-init"]  # `drove train ner --random-init` is hidden, the same draw
    data_model = ["--data", data, "--model", model]
    script = os.path.join(args.pack, "pytorch_ner.py")
    cmds = planned_commands(drove, sys.executable, script, data, model, work, kcache, init)
    report.set("runs", {"batches": list(BATCHES), "steps": STEPS, "warmup": WARMUP, "bucket_window": BUCKET_WINDOW,
                        "host_floor": HOST_FLOOR, "launches": LAUNCHES, "profile": PROFILE,
                        "step_configs": {c: step_flags(c) for c in CONFIG_ORDER}, "random_init": not real})

    # 1. The host floor, on an empty kernel cache.
    host = measured(report, "host_floor", cmds["host_floor"], env, deadline("host_floor"), HOST_FLOOR["batch"],
                    HOST_FLOOR["warmup"])
    files, size = folder_size(kcache)
    report.set("kernel_cache_after_host_floor", {"path": kcache, "files": files, "bytes": size})

    # 2. PyTorch at both batches, f32 then TF32, in one process; then drove's
    # three configurations at both batches, every step on first.
    run_pytorch(report, cmds["pytorch"], env, deadline("pytorch"))
    fitted = {}
    for config in CONFIG_ORDER:
        for batch in BATCHES:
            key = bench_key(batch, config)
            cmd = cmds[key]
            if batch != BATCHES[0]:
                steps, why = fit_steps(STEPS, WARMUP, batch, phase_deadline(key, left()),
                                       report.data.get(bench_key(BATCHES[0], config)))
                fitted[config] = {"requested": STEPS, "steps": steps, "why_fewer": why}
                report.set(f"b{batch}_steps", fitted)
                if steps != STEPS:
                    cmd = drove_bench(drove, batch, steps, WARMUP, config, kcache, data_model, init)
            measured(report, key, cmd, env, deadline(key), batch, WARMUP)

    # 3. Kernels launched, reads and uploads a step; its first step is the warm one.
    launches = measured(report, "launches", cmds["launches"], env, deadline("launches"), LAUNCHES["batch"],
                        LAUNCHES["warmup"])
    report.set("first_step", first_step_summary(host, launches))

    # 4. Every kernel's time at batch 256, from cubecl's profiling log.
    profile_phase(report, "profile_b256", cmds["profile_b256"], env, deadline("profile_b256"),
                  os.path.join(work, "profile"), os.path.join(out, "profile-b256.log.xz"),
                  PROFILE["warmup"] + PROFILE["steps"], PROFILE["batch"], PROFILE["warmup"])

    # 5. cubek's matmul strategies beside cuBLAS, as many shapes as fit: no
    # new shape after 30% of the deadline (a shape compiles every kernel it
    # tries before timing it, and a sweep cut at its deadline prints nothing).
    d = deadline("matmul")
    sweep = run_json(report, "matmul", matmul_bench(drove, max(5.0, 0.3 * d)), env, d)
    report.set("matmul", sweep)
    report.set("matmul_summary", matmul_summary(sweep))

    # 6. Four ranks on the one GPU against one, at f32, gradients through the host.
    report.set("train_equivalence_world4_f32",
               train_equivalence(report, drove, data, model, env, work, 4,
                                 lambda: deadline("equivalence_world1"), lambda: deadline("equivalence_world4"),
                                 extra=EQUIVALENCE_FLAGS, init=init, name="train equivalence world 4 f32"))

    # 7. The diversity story on those four ranks, the gradient path at auto.
    summaries = {}
    for seeding in ("naive", "derived"):
        shutil.rmtree(os.path.join(work, f"story-{seeding}"), ignore_errors=True)
        summaries[seeding] = run_json(report, f"story {seeding}", cmds[f"story_{seeding}"], env,
                                      deadline(f"story_{seeding}"))
        report.set("story_gpu", {**story_verdict(summaries.get("naive"), summaries.get("derived")),
                                 "gradient_path": "auto", "summaries": summaries, "random_init": not real})

    # 8. With time left: NCCL at world 1 and the in-place buckets; world 2
    # where NCCL allows it; F1 after one epoch.
    if left() > 30:
        report.set("nccl", run_json(report, "nccl", cmds["nccl"], env, min(15, deadline("nccl"))))
        report.set("in_place", run_json(report, "in place", cmds["in_place"], env, min(15, deadline("in_place"))))
    else:
        report.set("nccl", f"not measured: {left():.0f} s left of the budget (needs 30)")
    code = versions["nccl"].get("code") if isinstance(versions["nccl"], dict) else None
    if code is not None and code >= MULTI_RANK_GPU_FROM and left() > 90:
        env2 = {**env, "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
        report.set("world2", {"allowed": True,
                              "why": f"NCCL {versions['nccl']['version']} with NCCL_MULTI_RANK_GPU_ENABLE=1"})
        report.set("in_place_world2", run_json(report, "in place world 2", cmds["in_place_world2"], env2,
                                               min(30, deadline("in_place_world2")), every_rank=True))
        report.set("train_equivalence", train_equivalence(
            report, drove, data, model, env2, work, 2, lambda: min(25, deadline("equivalence_world2_1")),
            lambda: min(35, deadline("equivalence_world2_2")), init=init))
    elif code is not None and code >= MULTI_RANK_GPU_FROM:
        report.set("world2", {"allowed": True, "measured": False, "why": f"{left():.0f} s left (needs 90)"})
    else:
        why = (f"NCCL {versions['nccl'].get('version')} is older than 2.30, which refuses two ranks on one GPU "
               "(\"Duplicate GPU detected\")" if code is not None
               else f"the NCCL version is unknown: {versions['nccl']}")
        report.set("world2", {"allowed": False, "why": why})
    if real and left() > 150:
        f1 = {}
        shutil.rmtree(os.path.join(work, "run"), ignore_errors=True)
        summary = run_json(report, "drove f1", cmds["f1_drove"], env, left() / 2 - 5)
        f1["drove_test_f1"] = summary and summary.get("test_f1")
        theirs_f1 = run_json(report, "pytorch f1", cmds["f1_pytorch"], env, left() - 10)
        f1["pytorch_test_f1"] = theirs_f1 and (theirs_f1.get("history") or [{}])[-1].get("test_f1")
        if f1["drove_test_f1"] is not None and f1["pytorch_test_f1"] is not None:
            f1["difference_points"] = 100 * (f1["drove_test_f1"] - f1["pytorch_test_f1"])
        report.set("f1_after_one_epoch", f1)
    elif not real:
        report.set("f1_after_one_epoch", "not measured: the weights did not travel (random initialisation)")
    else:
        report.set("f1_after_one_epoch", f"not measured: {left():.0f} s left of the budget (needs 150)")
    report.set("seconds", time.time() - t0)
    log(f"wrote {report.path} after {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

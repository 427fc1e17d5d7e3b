"""The GPU check's run, on the check machine (see scripts/gpu-check.sh).

Unpacks what `gpu-check.sh prepare` packed, picks the CUDA headers and the
libraries (NVRTC, NCCL) from one place (`choose_cuda`), records their
versions, then within the time budget (400 s: one run of about 7 minutes)
runs the phases below, most valuable first, each with its own deadline
(`phase_deadline`: its cap, less what the phases after it are kept), writing
the JSON after every phase so that a cut run keeps what it measured:

  1. the toolchain and the device;
  2. `drove_b32`: `drove bench train --device cuda` at batch 32 (300 steps
     after 20 untimed, bucket window 16) with a new, empty kernel cache
     (`--kernel-cache WORK/kcache`, also DROVE_KERNEL_CACHE for every later
     drove): sentences/s, the first step, kernels launched and compiled, and
     the GPU memory at its peak (sampled from nvidia-smi);
  3. `pytorch_b32`: pytorch_ner.py with `--fused-adamw` on the same batches'
     settings; `drove_over_pytorch_b32`;
  4. `drove_warm`: drove again for 5 steps on the cache phase 2 filled:
     `first_step` sets the cold and the warm first step side by side with the
     3 s target;
  5. batch 256, drove and PyTorch (`drove_b256`, `pytorch_b256`,
     `drove_over_pytorch_b256`): 300 steps after 10 (several epochs of
     CoNLL-2003), fewer where drove's batch-32 speed says 300 would not fit
     the phase's deadline (`b256_steps` says why);
  6. `train_equivalence_world4_host`: four ranks on the one GPU under
     `drove run --np 4` with `--gradient-path host` (batch 4 each) against
     one rank (batch 16): parameters after 5 steps within 1e-5 relative;
  7. `story_gpu`: the diversity story on four ranks of the one GPU
     (masking augmentation 0.15, diagnosed every 5 of 12 steps): naive
     seeding agrees 1.0 and sets the alarm off, derived seeding lies within
     3 sigma of p^2+(1-p)^2 = 0.745 and does not;
  8. `nccl` (world 1, 64 MiB beside a device copy) and `in_place` (the
     in-place buckets on burn tensors of five layouts); where the NCCL loaded
     allows two ranks on one GPU (2.30 and later, with
     NCCL_MULTI_RANK_GPU_ENABLE=1) both at world 2 and the world-2
     `train_equivalence`;
  9. when more than 150 s are left: test entity F1 after one epoch, both.

`targets` (last in the JSON, rewritten with every write) sets each target
beside what was measured: drove over PyTorch >= 1 at batch 32 and 256, a
warm first step under 3 s, drove's peak GPU memory no more than PyTorch's.

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
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

# NCCL accepts several ranks on one GPU from 2.30 (NCCL_VERSION_CODE 23000),
# when NCCL_MULTI_RANK_GPU_ENABLE=1; before, it refuses with "Duplicate GPU detected".
MULTI_RANK_GPU_FROM = 23000

# The warm first step's target (seconds).
WARM_FIRST_STEP_TARGET_S = 3.0

# The phases in the order they run, each with its cap (seconds) and the floor
# an earlier phase leaves it: a phase's deadline is its cap, or less where the
# time left less the floors of the phases still to come is less. Phases not
# named here (world 2, F1) get what is left, less FINAL_RESERVE_S.
PLAN = (
    ("drove_b32", 110, 40),
    ("pytorch_b32", 60, 25),
    ("drove_warm", 40, 15),
    ("drove_b256", 80, 35),
    ("pytorch_b256", 45, 25),
    ("equivalence_world1", 35, 15),
    ("equivalence_world4", 55, 25),
    ("story_naive", 60, 25),
    ("story_derived", 60, 25),
    ("nccl", 30, 10),
    ("in_place", 30, 10),
)
# Seconds kept for writing the JSON at the end.
FINAL_RESERVE_S = 5


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
    """The binary, the data and the model folder, decompressed into `work`."""
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
    (so a cu12 library is never taken while a cu13 one is there)."""
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
        "problems": problems,
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
    `choose_cuda`, with the `libnccl.so` / `libnvrtc.so` names cudarc opens
    (the wheels ship sonames only) linked in work/lib."""
    roots, extra = site_roots_here()
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    choice = choose_cuda(roots, nvcc=nvcc, cuda_path=os.environ.get("CUDA_PATH"), extra_lib_dirs=extra)
    links = os.path.join(work, "lib")
    os.makedirs(links, exist_ok=True)
    folders = []
    for link, target in (("libnccl.so", choice["nccl"]), ("libnvrtc.so", choice["nvrtc"])):
        if target:
            dst = os.path.join(links, link)
            if os.path.lexists(dst):
                os.remove(dst)
            os.symlink(target, dst)
            folders.append(os.path.dirname(target))
    env = dict(os.environ)
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


def run_json(report, phase, cmd, env, timeout, cwd=None, every_rank=False):
    """Runs `cmd`; returns the last JSON object rank 0 printed (every rank's,
    by rank, with `every_rank`), or None after recording why there is none.
    A command that printed its JSON and then failed (a check that did not
    hold) has the failure recorded and its JSON returned."""
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
    if code is None:
        report.error(phase, f"did not finish within {timeout:.0f} s; stderr tail: {stderr[-2000:]}")
        return None
    out = subprocess.CompletedProcess(cmd, code, stdout, stderr)
    took = time.time() - started
    found = json_lines(out.stdout)
    if out.returncode != 0:
        report.error(phase, f"exit {out.returncode} after {took:.1f} s: {out.stderr.strip()[-3000:]}")
    if not found or 0 not in found:
        if out.returncode == 0:
            report.error(phase, f"printed no JSON (exit 0 after {took:.1f} s): {out.stderr.strip()[-2000:]}")
        return None
    value = {str(r): v for r, v in sorted(found.items())} if every_rank else found[0]
    value["phase_seconds"] = took
    value["exit_code"] = out.returncode
    return value


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


def train_equivalence(report, drove, data, model, env, work, world, deadline_one, deadline_many,
                      extra=(), init=(), name="train equivalence"):
    """`world` ranks on one GPU (batch 16 / world each) against world 1 (batch
    16), with the flags `extra` on both (e.g. `--gradient-path host`) and
    `init` (`--random-init` where the weights did not travel): the parameters
    after 5 steps (16 sentences, 5 epochs) must agree within 1e-5 relative,
    and every step's loss and gradient norm within SCALE_BOUND.
    `deadline_one()` and `deadline_many()` give each run's seconds when it starts."""
    small = ["train", "ner", "--device", "cuda:0", "--data", data, "--model", model, "--max-train-sentences", "16",
             "--epochs", "5", "--dropout", "0", "--eval", "", "--lr-scaling", "none", "--lr", "1e-3",
             "--warmup", "0", "--micro-batches", "1", "--json"] + list(extra) + list(init)
    tag = "-".join(a.lstrip("-") for a in extra)
    one = os.path.join(work, "equivalence" + (f"-{tag}" if tag else "") + "-1")
    many = os.path.join(work, "equivalence" + (f"-{tag}" if tag else "") + f"-{world}")
    for d in (one, many):
        shutil.rmtree(d, ignore_errors=True)  # a checkpoint of an earlier try would be read as this one's
    result = {"steps": 5, "bound": 1e-5, "world": world, "batch_per_rank": 16 // world, "flags": list(extra),
              "random_init": bool(init)}
    result["world1"] = run_json(report, f"{name} world 1", [drove] + small + ["--batch-size", "16", "--out", one],
                                env, deadline_one())
    result[f"world{world}"] = run_json(report, f"{name} world {world}",
                                       under_run(drove, world, small + ["--batch-size", str(16 // world),
                                                                        "--out", many]),
                                       env, deadline_many())
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


def story_args(seeding, data, model, out, init=()):
    """`drove train ner`'s flags for one run of the story: 12 steps of 4 ranks
    of 32 on one epoch of exactly that many sentences, diagnosed every 5."""
    return ["train", "ner", "--device", "cuda:0", "--gradient-path", "host", "--augment-mask", str(STORY_MASK),
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
# What the phases measured, summed up.

def sentences_per_s(run):
    return run.get("sentences_per_s") if isinstance(run, dict) else None


def ratio(ours, theirs):
    """drove's sentences/s over PyTorch's, or None where either is missing."""
    a, b = sentences_per_s(ours), sentences_per_s(theirs)
    return a / b if a and b else None


def fit_steps(requested, warmup, batch, deadline_s, reference, minimum=30, margin=0.8):
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


def targets(data):
    """Each target beside what was measured (`met` is null where it was not)."""
    out = {}
    for batch in ("b32", "b256"):
        ours, theirs = data.get(f"drove_{batch}"), data.get(f"pytorch_{batch}")
        r = ratio(ours, theirs)
        out[f"{batch}_ratio"] = {
            "target": "drove/pytorch sentences_per_s >= 1", "drove_sentences_per_s": sentences_per_s(ours),
            "pytorch_sentences_per_s": sentences_per_s(theirs), "ratio": r, "met": None if r is None else r >= 1.0,
            "kernels_launched_per_step": ours.get("kernels_launched_per_step") if isinstance(ours, dict) else None}
    warm = data.get("drove_warm_first_step_seconds")
    out["warm_first_step"] = {"target_s": WARM_FIRST_STEP_TARGET_S, "seconds": warm,
                              "met": None if warm is None else warm < WARM_FIRST_STEP_TARGET_S}
    memory = {"target": "drove's sampled peak GPU memory (over idle) <= PyTorch's"}
    mets = []
    for batch in ("b32", "b256"):
        ours, theirs = peak_mib(data.get(f"drove_{batch}")), peak_mib(data.get(f"pytorch_{batch}"))
        met = None if ours is None or theirs is None else ours <= theirs
        memory[batch] = {"drove_mib": ours, "pytorch_mib": theirs, "met": met}
        if met is not None:
            mets.append(met)
    memory["met"] = all(mets) if mets else None
    out["peak_memory"] = memory
    goals = [out[k]["met"] for k in ("b32_ratio", "b256_ratio", "warm_first_step", "peak_memory")]
    out["all_met"] = all(goals) if None not in goals else None
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

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=400, help="seconds for everything")
    ap.add_argument("--steps", type=int, default=300, help="timed steps of the throughput runs (both batches)")
    args = ap.parse_args()
    t0 = time.time()
    left = lambda: args.budget - (time.time() - t0)
    os.makedirs(args.out, exist_ok=True)
    report = Report(os.path.join(args.out, "gpu-check.json"), summary=targets)
    report.set("budget_s", args.budget)
    work = os.path.join(args.out, "work")
    drove, data, model = unpack(args.pack, work)
    meta = json.load(open(os.path.join(args.pack, "pack.json")))
    report.set("pack", meta)
    real = meta["weights"] == "real"
    if real:
        f16 = os.path.join(model, "model.f16.safetensors")
        out = subprocess.run([drove, "weights", f16, os.path.join(model, "model.safetensors"), "--to", "f32"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            report.error("weights", out.stderr)
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
    report.set("setup_seconds", time.time() - t0)

    # One kernel cache for every drove run, new for the cold one: the flag for
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

    init = [] if real else ["--random-init"]
    data_model = ["--data", data, "--model", model]
    script = os.path.join(args.pack, "pytorch_ner.py")

    def drove_bench(batch, steps, warmup):
        return ([drove, "bench", "train", "--device", "cuda", "--json", "--batch-size", str(batch),
                 "--steps", str(steps), "--warmup-steps", str(warmup), "--bucket-window", "16",
                 "--kernel-cache", kcache] + data_model + init)

    def pytorch_bench(batch, steps, warmup):
        return ([sys.executable, script, "--device", "cuda", "--fused-adamw", "--batch-size", str(batch),
                 "--steps", str(steps), "--warmup-steps", str(warmup), "--bucket-window", "16"] + data_model + init)

    def measured(key, label, cmd):
        """Runs `cmd` under its phase's deadline with the GPU memory sampled;
        records its JSON under `key`."""
        # Each step on stderr, so that a run cut at its deadline still says
        # how far it got and what its steps took.
        logged = {**env, "RUST_LOG": "info,drove_bench=debug,wgpu_hal=off"}
        with GpuMemory() as mem:
            value = run_json(report, label, cmd, logged, deadline(key))
        if value:
            value["gpu_memory_sampled"] = mem.result()
        report.set(key, value)
        return value

    # 2-3. Batch 32: drove with an empty kernel cache, then PyTorch (20
    # untimed steps each: cubecl autotunes per shape, cuBLAS picks on first use).
    ours = measured("drove_b32", "drove b32 (cold kernel cache)", drove_bench(32, args.steps, 20))
    files, size = folder_size(kcache)
    report.set("kernel_cache_after_cold", {"path": kcache, "files": files, "bytes": size})
    theirs = measured("pytorch_b32", "pytorch b32", pytorch_bench(32, args.steps, 20))
    report.set("drove_over_pytorch_b32", ratio(ours, theirs))

    # 4. The same run on the cache the cold one filled: its first step.
    warm = run_json(report, "drove warm kernel cache", drove_bench(32, 5, 0), env, deadline("drove_warm"))
    report.set("drove_warm", warm)
    report.set("drove_warm_first_step_seconds", warm.get("first_step_seconds") if warm else None)
    report.set("first_step", first_step_summary(ours, warm))

    # 5. Batch 256 (55 steps an epoch: both cycle epochs), as many steps as fit.
    steps, why = fit_steps(args.steps, 10, 256, phase_deadline("drove_b256", left()), ours)
    report.set("b256_steps", {"requested": args.steps, "steps": steps, "warmup": 10, "why_fewer": why})
    ours256 = measured("drove_b256", "drove b256", drove_bench(256, steps, 10))
    theirs256 = measured("pytorch_b256", "pytorch b256", pytorch_bench(256, steps, 10))
    report.set("drove_over_pytorch_b256", ratio(ours256, theirs256))

    # 6. Four ranks on the one GPU, gradients staged through the host, against one.
    init_ner = init  # `drove train ner --random-init` is a hidden flag, the same draw as bench train's
    report.set("train_equivalence_world4_host",
               train_equivalence(report, drove, data, model, env, work, 4,
                                 lambda: deadline("equivalence_world1"), lambda: deadline("equivalence_world4"),
                                 extra=["--gradient-path", "host"], init=init_ner,
                                 name="train equivalence world 4 host"))

    # 7. The diversity story on those four ranks.
    summaries = {}
    for seeding in ("naive", "derived"):
        out_dir = os.path.join(work, f"story-{seeding}")
        shutil.rmtree(out_dir, ignore_errors=True)
        cmd = under_run(drove, STORY_WORLD, story_args(seeding, data, model, out_dir, init_ner))
        summaries[seeding] = run_json(report, f"story {seeding}", cmd, env, deadline(f"story_{seeding}"))
        report.set("story_gpu", {**story_verdict(summaries.get("naive"), summaries.get("derived")),
                                 "summaries": summaries, "random_init": not real})

    # 8. NCCL at world 1 and the in-place buckets; world 2 where NCCL allows it.
    sizes = ["--sizes", "64MiB"]
    report.set("nccl", run_json(report, "nccl", [drove, "bench", "nccl", "--json"] + sizes, env, deadline("nccl")))
    report.set("in_place", run_json(report, "in place", [drove, "bench", "nccl", "--buckets", "--json"], env,
                                    deadline("in_place")))
    code = versions["nccl"].get("code") if isinstance(versions["nccl"], dict) else None
    if code is not None and code >= MULTI_RANK_GPU_FROM:
        env2 = {**env, "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
        report.set("world2", {"allowed": True,
                              "why": f"NCCL {versions['nccl']['version']} with NCCL_MULTI_RANK_GPU_ENABLE=1"})
        report.set("in_place_world2", run_json(report, "in place world 2",
                                               under_run(drove, 2, ["bench", "nccl", "--buckets", "--gpu", "0",
                                                                    "--json"]),
                                               env2, min(40, deadline("in_place_world2")), every_rank=True))
        report.set("nccl_world2", run_json(report, "nccl world 2",
                                           under_run(drove, 2, ["bench", "nccl", "--gpu", "0", "--json"] + sizes),
                                           env2, min(45, deadline("nccl_world2")), every_rank=True))
        report.set("train_equivalence", train_equivalence(
            report, drove, data, model, env2, work, 2, lambda: min(75, deadline("equivalence_world2_1")),
            lambda: min(75, deadline("equivalence_world2_2")), init=init_ner))
    else:
        why = (f"NCCL {versions['nccl'].get('version')} is older than 2.30, which refuses two ranks on one GPU "
               "(\"Duplicate GPU detected\")" if code is not None
               else f"the NCCL version is unknown: {versions['nccl']}")
        report.set("world2", {"allowed": False, "why": why})

    # 9. F1 after one epoch, where time is left.
    if real and left() > 150:
        f1 = {}
        run_out = os.path.join(work, "run")
        shutil.rmtree(run_out, ignore_errors=True)
        summary = run_json(report, "drove f1", [drove, "train", "ner", "--device", "cuda", "--epochs", "1",
                                                "--eval", "test", "--json", "--out", run_out] + data_model,
                           env, left() / 2 - 5)
        f1["drove_test_f1"] = summary and summary.get("test_f1")
        theirs_f1 = run_json(report, "pytorch f1", [sys.executable, script, "--device", "cuda", "--epochs", "1"]
                             + data_model, env, left() - 10)
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

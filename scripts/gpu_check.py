"""The GPU check's run, on the check machine (see scripts/gpu-check.sh).

Unpacks what `gpu-check.sh prepare` packed, picks the CUDA headers and the
libraries (NVRTC, NCCL) from one place (`choose_cuda`), records their
versions, then within the time budget runs, each with its own deadline,
writing the JSON after every phase so that a cut run keeps what it measured:

  1. `drove bench nccl`: NCCL all-reduce at world size 1 (64 MiB, 1 GiB)
     beside a device-to-device copy;
  2. `drove bench nccl --buckets`: the in-place path of training
     (`NcclBuckets`, `device_memory`) on burn tensors of five layouts, each
     result read back through burn and compared bit for bit;
  3. where the NCCL loaded allows two ranks on one GPU (2.30 and later, with
     NCCL_MULTI_RANK_GPU_ENABLE=1): phases 1 and 2 at world size 2 under
     `drove run --np 2`, and a short `drove train ner --device cuda:0` at
     world 2 (batch 8 each) against world 1 (batch 16): parameters after 5
     steps within 1e-5 relative, as the CPU tests compare them;
  4. `drove bench train --device cuda` and `pytorch_ner.py --device cuda`:
     sentences/s over 200 steps of batch 32 on CoNLL-2003 (bucketed alike),
     MiniLM-L6's shape, and the GPU memory each used at its peak (sampled
     from nvidia-smi for both, beside each one's own counter);
  5. when the real weights travelled and time is left: test entity F1 after
     one epoch, for both.

Standard library only (the check machine has Python and torch, no network);
`choose_cuda` is unit-tested by scripts/test_gpu_check.py.
"""

import argparse
import ctypes
import json
import lzma
import os
import shutil
import struct
import subprocess
import sys
import threading
import time

# NCCL accepts several ranks on one GPU from 2.30 (NCCL_VERSION_CODE 23000),
# when NCCL_MULTI_RANK_GPU_ENABLE=1; before, it refuses with "Duplicate GPU detected".
MULTI_RANK_GPU_FROM = 23000


def log(msg):
    print(f"gpu-check: {msg}", file=sys.stderr, flush=True)


class Report:
    def __init__(self, path):
        self.path = path
        self.data = {"check": "drove gpu check", "started_unix": time.time(), "errors": []}

    def set(self, key, value):
        self.data[key] = value
        self.write()

    def error(self, phase, message):
        self.data["errors"].append({"phase": phase, "error": message[-4000:]})
        self.write()

    def write(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=2)
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
        out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        report.error(phase, f"did not finish within {timeout:.0f} s; stderr tail: {stderr[-2000:]}")
        return None
    except OSError as e:
        report.error(phase, f"could not start {cmd[0]}: {e}")
        return None
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


def train_equivalence(report, drove, data, model, env, work, left):
    """World 2 on one GPU (batch 8 each) against world 1 (batch 16): the
    parameters after 5 steps must agree within 1e-5 relative."""
    small = ["train", "ner", "--device", "cuda:0", "--data", data, "--model", model, "--max-train-sentences", "16",
             "--epochs", "5", "--dropout", "0", "--eval", "", "--lr-scaling", "none", "--lr", "1e-3",
             "--warmup", "0", "--micro-batches", "1", "--json"]
    one, two = os.path.join(work, "equivalence-1"), os.path.join(work, "equivalence-2")
    result = {"steps": 5, "bound": 1e-5}
    result["world1"] = run_json(report, "train world 1", [drove] + small + ["--batch-size", "16", "--out", one],
                                env, min(75, left() - 250))
    result["world2"] = run_json(report, "train world 2",
                                under_run(drove, 2, small + ["--batch-size", "8", "--out", two]),
                                env, min(75, left() - 200))
    if result["world1"] and result["world2"]:
        try:
            d = relative_difference(read_checkpoint(one), read_checkpoint(two))
            result["relative_difference"] = d
            result["within_bound"] = d < 1e-5
            if d >= 1e-5:
                report.error("train equivalence", f"world 2 differs from world 1 by {d:e} (relative) after 5 steps")
        except (OSError, ValueError, KeyError) as e:
            report.error("train equivalence", f"comparing the checkpoints: {e}")
    return result


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=440, help="seconds for everything")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    t0 = time.time()
    left = lambda: args.budget - (time.time() - t0)
    os.makedirs(args.out, exist_ok=True)
    report = Report(os.path.join(args.out, "gpu-check.json"))
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

    sizes = ["--sizes", "64MiB,1GiB"]
    report.set("nccl", run_json(report, "nccl", [drove, "bench", "nccl", "--json"] + sizes, env, min(60, left())))
    report.set("in_place", run_json(report, "in place", [drove, "bench", "nccl", "--buckets", "--json"], env,
                                    min(40, left())))

    code = versions["nccl"].get("code") if isinstance(versions["nccl"], dict) else None
    if code is not None and code >= MULTI_RANK_GPU_FROM:
        env2 = {**env, "NCCL_MULTI_RANK_GPU_ENABLE": "1"}
        report.set("world2", {"allowed": True, "why": f"NCCL {versions['nccl']['version']} with NCCL_MULTI_RANK_GPU_ENABLE=1"})
        report.set("in_place_world2", run_json(report, "in place world 2",
                                               under_run(drove, 2, ["bench", "nccl", "--buckets", "--gpu", "0",
                                                                    "--json"]),
                                               env2, min(40, left()), every_rank=True))
        report.set("nccl_world2", run_json(report, "nccl world 2",
                                           under_run(drove, 2, ["bench", "nccl", "--gpu", "0", "--json"] + sizes),
                                           env2, min(45, left()), every_rank=True))
        if real:
            report.set("train_equivalence", train_equivalence(report, drove, data, model, env2, work, left))
        else:
            report.set("train_equivalence", "not run: the weights did not travel (drove train ner needs them)")
    else:
        why = (f"NCCL {versions['nccl'].get('version')} is older than 2.30, which refuses two ranks on one GPU "
               "(\"Duplicate GPU detected\")" if code is not None else f"the NCCL version is unknown: {versions['nccl']}")
        report.set("world2", {"allowed": False, "why": why})

    init = [] if real else ["--random-init"]
    # 20 untimed steps on both sides: cubecl autotunes its kernels per shape and
    # cuBLAS picks its own on first use.
    common = ["--batch-size", "32", "--steps", str(args.steps), "--warmup-steps", "20", "--bucket-window", "16",
              "--data", data, "--model", model]
    with GpuMemory() as mem:
        ours = run_json(report, "drove train", [drove, "bench", "train", "--device", "cuda", "--json"]
                                               + common + init, env, min(200, left() - 100))
    if ours:
        ours["gpu_memory_sampled"] = mem.result()
    report.set("drove_train", ours)
    script = os.path.join(args.pack, "pytorch_ner.py")
    with GpuMemory() as mem:
        theirs = run_json(report, "pytorch train", [sys.executable, script, "--device", "cuda"] + common + init,
                          env, min(150, left() - 20))
    if theirs:
        theirs["gpu_memory_sampled"] = mem.result()
    report.set("pytorch_train", theirs)
    if ours and theirs:
        report.set("throughput_ratio_drove_over_pytorch", ours["sentences_per_s"] / theirs["sentences_per_s"])

    if real and left() > 150:
        f1 = {}
        run_out = os.path.join(work, "run")
        summary = run_json(report, "drove f1", [drove, "train", "ner", "--device", "cuda", "--epochs", "1",
                                                "--eval", "test", "--json", "--out", run_out,
                                                "--data", data, "--model", model], env, left() / 2 - 5)
        f1["drove_test_f1"] = summary and summary.get("test_f1")
        theirs_f1 = run_json(report, "pytorch f1", [sys.executable, script, "--device", "cuda", "--epochs", "1",
                                                    "--data", data, "--model", model], env, left() - 10)
        f1["pytorch_test_f1"] = theirs_f1 and (theirs_f1.get("history") or [{}])[-1].get("test_f1")
        if f1["drove_test_f1"] is not None and f1["pytorch_test_f1"] is not None:
            f1["difference_points"] = 100 * (f1["drove_test_f1"] - f1["pytorch_test_f1"])
        report.set("f1_after_one_epoch", f1)
    elif not real:
        report.set("f1_after_one_epoch", "not measured: the weights did not travel (random initialisation)")
    else:
        report.set("f1_after_one_epoch", f"not measured: {left():.0f} s left of the budget")
    report.set("seconds", time.time() - t0)
    log(f"wrote {report.path} after {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()

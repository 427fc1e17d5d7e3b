"""The GPU check's run, on the check machine (see scripts/gpu-check.sh).

Unpacks what `gpu-check.sh prepare` packed, sets up the CUDA libraries the
Python wheels ship (NCCL, NVRTC), then within the time budget runs, each with
its own deadline, writing the JSON after every phase so that a cut run keeps
what it measured:

  1. `drove bench nccl`: NCCL all-reduce at world size 1 (64 MiB, 1 GiB)
     beside a device-to-device copy;
  2. `drove bench train --device cuda` and `pytorch_ner.py --device cuda`:
     sentences/s over 200 steps of batch 32 on CoNLL-2003 (bucketed alike),
     MiniLM-L6's shape, and the GPU memory each used at its peak (sampled
     from nvidia-smi for both, beside each one's own counter);
  3. when the real weights travelled and time is left: test entity F1 after
     one epoch, for both.

Standard library only (the check machine has Python and torch, no network).
"""

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import threading
import time


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


def find(roots, prefix):
    for root in roots:
        for folder, _, files in os.walk(root):
            for f in sorted(files):
                if f.startswith(prefix):
                    return os.path.join(folder, f)
    return None


def library_env(work):
    """LD_LIBRARY_PATH with NCCL and NVRTC from the Python wheels, and the
    `libnccl.so` / `libnvrtc.so` names cudarc opens (the wheels ship sonames only)."""
    roots = []
    try:
        import nvidia  # the namespace package of the CUDA wheels
        roots = [os.path.dirname(p) for p in nvidia.__path__]
    except ImportError:
        pass
    try:
        import torch
        roots.append(os.path.join(os.path.dirname(torch.__file__), "lib"))
    except ImportError:
        pass
    links = os.path.join(work, "lib")
    os.makedirs(links, exist_ok=True)
    found = {}
    folders = []
    for link, prefix in (("libnccl.so", "libnccl.so."), ("libnvrtc.so", "libnvrtc.so.")):
        target = find(roots, prefix)
        found[link] = target
        if target:
            dst = os.path.join(links, link)
            if os.path.lexists(dst):
                os.remove(dst)
            os.symlink(target, dst)
            folders.append(os.path.dirname(target))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([links] + folders + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    if "CUDA_PATH" not in env:
        nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
        if nvcc:
            env["CUDA_PATH"] = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    return env, found


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


def run_json(report, phase, cmd, env, timeout, cwd=None):
    """Runs `cmd`; returns the last JSON line it printed, or None after
    recording why there is none."""
    log(f"{phase}: {' '.join(cmd)} (deadline {timeout:.0f} s)")
    started = time.time()
    try:
        out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as e:
        report.error(phase, f"did not finish within {timeout:.0f} s; stderr tail: {(e.stderr or '')[-2000:]}")
        return None
    except OSError as e:
        report.error(phase, f"could not start {cmd[0]}: {e}")
        return None
    took = time.time() - started
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        report.error(phase, f"exit {out.returncode} after {took:.1f} s: {out.stderr.strip()[-3000:]}")
        return None
    value = json.loads(lines[-1])
    value["phase_seconds"] = took
    return value


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=470, help="seconds for everything")
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
    env, found = library_env(work)
    report.set("libraries", {**found, "CUDA_PATH": env.get("CUDA_PATH")})
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        report.set("device", smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else None)
        if smi.returncode != 0:
            report.error("device", smi.stderr)
    except (OSError, subprocess.TimeoutExpired) as e:
        report.set("device", None)
        report.error("device", f"nvidia-smi: {e}")

    nccl = run_json(report, "nccl", [drove, "bench", "nccl", "--sizes", "64MiB,1GiB", "--json"], env, min(90, left()))
    report.set("nccl", nccl)

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

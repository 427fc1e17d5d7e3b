"""PyTorch gloo all-reduce timed the way `drove bench allreduce-worker` times drove's.

One process per rank (bench/netns_allreduce.sh starts one in each network
namespace). f32 sum `all_reduce` in place per size: one warm-up op (result
checked), two more timed to choose the count (0.5 s / warm-up time, clamped to
[--iters, 2000], rank 0's count broadcast to all), then per iteration a barrier
and one timed op. Rank 0 prints one JSON line per size with drove's fields:
bytes, size, iterations, median_us (upper median, as drove's), algbw_gbps =
bytes / median / 1e9 and busbw_gbps = algbw * 2(N-1)/N.

    python3 bench/gloo_allreduce.py --rank R --world-size N \
        --master ADDR:PORT --sizes 1024B,1048576B [--iters 10]

GLOO_SOCKET_IFNAME pins gloo's data sockets to one interface (the veth).
"""

import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KiB": 1 << 10,
         "M": 1 << 20, "MB": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GiB": 1 << 30}


def parse_sizes(text):
    out = []
    for part in text.split(","):
        part = part.strip()
        digits = len(part) - len(part.lstrip("0123456789"))
        num, unit = part[:digits], part[digits:]
        if not num or unit not in UNITS:
            raise SystemExit(f"size {part!r}: expected a whole number and B, KiB, MiB or GiB")
        out.append(int(num) * UNITS[unit])
    return out


def human(b):
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return f"{b}B"


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master", required=True, help="ADDR:PORT of rank 0's TCP store")
    p.add_argument("--sizes", type=parse_sizes, required=True)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for init and each op")
    args = p.parse_args()
    rank, n = args.rank, args.world_size
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}",
        rank=rank,
        world_size=n,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    want = float(n * (n + 1) // 2)
    for nbytes in args.sizes:
        length = nbytes // 4
        data = torch.full((length,), float(rank + 1), dtype=torch.float32)
        # Warm-up, checking the result once.
        dist.all_reduce(data, op=dist.ReduceOp.SUM)
        if data[0].item() != want or data[-1].item() != want:
            raise SystemExit(f"all_reduce of {nbytes} bytes gave {data[0].item()} and "
                             f"{data[-1].item()}, expected {want}")
        t = time.perf_counter()
        dist.all_reduce(data, op=dist.ReduceOp.SUM)
        dist.all_reduce(data, op=dist.ReduceOp.SUM)
        warm = (time.perf_counter() - t) / 2
        # Every rank uses rank 0's count.
        count = torch.tensor([min(max(int(0.5 / max(warm, 1e-9)), args.iters), 2000)], dtype=torch.int64)
        dist.broadcast(count, 0)
        iterations = int(count.item())
        times = []
        for _ in range(iterations):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(data, op=dist.ReduceOp.SUM)
            times.append(time.perf_counter() - t)
        if rank == 0:
            secs = median(times)
            algbw = nbytes / secs / 1e9
            print(json.dumps({
                "collective": "allreduce",
                "bytes": nbytes,
                "size": human(nbytes),
                "iterations": iterations,
                "median_us": secs * 1e6,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * 2 * (n - 1) / n,
                "backend": "gloo",
                "torch": torch.__version__,
            }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

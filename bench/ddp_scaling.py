"""One rank of PyTorch DDP over gloo, the PyTorch side of bench/scaling.sh.

MiniLM-L6 with a token-classification head (transformers), DistributedDataParallel
at its defaults (bucket_cap_mb 25, its bucketed all-reduce overlapped with
backward), AdamW and clipping at norm 1.0, as `drove bench scaling` trains:
every batch padded to --pad-to tokens, so that every step does the same work.

    python bench/ddp_scaling.py --rank R --world-size N --master ADDR:PORT

Timed, after --warmup-steps untimed steps:
  step          --steps DDP steps (forward, backward with DDP's all-reduce, clip, AdamW)
  compute       --steps forward and backward passes under no_sync() (no all-reduce)
  slowest_compute the same, the slowest rank's of each pass (where ranks share cores)
  communication the gradients all-reduced alone, in DDP's bucket sizes
  optimizer     clipping and AdamW, inside the timed steps
exposed communication = (step - optimizer) - compute. Rank 0 prints one JSON line.
At one rank no process group is made and the step is the plain model's.
"""

import argparse
import datetime
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_ner import LABELS, encode, read_conll  # noqa: E402


def padded(batch, pad_id, width):
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (x, y, _) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
        labels[i, : len(y)] = torch.tensor(y)
    return ids, mask, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--master", default="127.0.0.1:29500", help="rank 0's ADDR:PORT")
    ap.add_argument("--data", default="assets/conll2003")
    ap.add_argument("--model", default="assets/minilm")
    ap.add_argument("--batch-size", type=int, default=8, help="sentences per rank and step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--pad-to", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--random-init", action="store_true")
    ap.add_argument("--timeout", type=float, default=600, help="seconds any collective may take")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(42)
    n, rank = args.world_size, args.rank

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    data = encode(tokenizer, read_conll(os.path.join(args.data, "train.txt")), args.pad_to)
    if args.random_init:
        config = AutoConfig.from_pretrained(args.model, num_labels=len(LABELS))
        model = AutoModelForTokenClassification.from_config(config)
    else:
        model = AutoModelForTokenClassification.from_pretrained(args.model, num_labels=len(LABELS))
    model.train()
    if n > 1:
        addr, port = args.master.rsplit(":", 1)
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=args.timeout))
        net = torch.nn.parallel.DistributedDataParallel(model)
        bucket_cap_mb = 25  # DDP's default, which the wrapper above keeps
    else:
        net, bucket_cap_mb = model, None
    optim = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    rng = random.Random(1000 + rank)

    def batch():
        return padded([data[rng.randrange(len(data))] for _ in range(args.batch_size)],
                      tokenizer.pad_token_id, args.pad_to)

    def forward_backward(ids, mask, labels):
        net(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()

    def barrier():
        if n > 1:
            dist.barrier()

    steps, optimizer = [], []
    for s in range(args.warmup_steps + args.steps):
        ids, mask, labels = batch()
        barrier()
        t0 = time.perf_counter()
        forward_backward(ids, mask, labels)
        t1 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if s >= args.warmup_steps:
            steps.append(t2 - t0)
            optimizer.append(t2 - t1)

    compute = []
    for _ in range(args.steps):
        ids, mask, labels = batch()
        barrier()
        t0 = time.perf_counter()
        if n > 1:
            with net.no_sync():
                forward_backward(ids, mask, labels)
        else:
            forward_backward(ids, mask, labels)
        compute.append(time.perf_counter() - t0)
        optim.zero_grad(set_to_none=True)

    # The gradients' bytes all-reduced alone, in buckets of DDP's cap.
    communication = []
    if n > 1:
        total = sum(p.numel() for p in model.parameters() if p.requires_grad)
        cap = bucket_cap_mb * (1 << 20) // 4
        buckets = [torch.ones(min(cap, total - k)) for k in range(0, total, cap)]
        for _ in range(args.steps):
            barrier()
            t0 = time.perf_counter()
            for b in buckets:
                dist.all_reduce(b)
            communication.append(time.perf_counter() - t0)

    # The slowest rank's compute of each step: what a synchronous step waits
    # for at least where ranks share cores.
    slowest = torch.tensor(compute, dtype=torch.float64)
    if n > 1:
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)

    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
    step = mean(steps)
    parts = {
        "optimizer": mean(optimizer),
        "communication": mean(communication),
        "compute": mean(compute),
        "slowest_compute": mean(slowest.tolist()),
        "exposed_communication": max(0.0, step - mean(optimizer) - mean(compute)) if n > 1 else 0.0,
        "step": step,
    }
    if rank == 0:
        print(json.dumps({
            "benchmark": "scaling",
            "impl": "ddp",
            "world_size": n,
            "batch_size": args.batch_size,
            "pad_to": args.pad_to,
            "bucket_cap_mb": bucket_cap_mb,
            "threads": args.threads,
            "torch": torch.__version__,
            "parts": parts,
            "per_step": [{"step": s} for s in steps],
            "sentences_per_s": args.batch_size * n / step,
            "steps_timed": len(steps),
        }), flush=True)
    if n > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

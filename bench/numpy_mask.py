"""Baseline for `drove bench mask`: the same MLM-style masking, vectorised in NumPy
the way HuggingFace's DataCollatorForLanguageModeling does it in torch (Bernoulli
matrix, special tokens excluded, 80/10/10 split), on a ready [batch, seq] array.
Prints one JSON object. Needs numpy (`python3 -m pip install numpy`).

    python3 bench/numpy_mask.py --batch 32 --seq 128 --seconds 2
"""
import argparse
import json
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--probability", type=float, default=0.15)
    args = ap.parse_args()

    rng = np.random.default_rng(42)
    ids = rng.integers(1000, 30522, size=(args.batch, args.seq), dtype=np.int64)
    lengths = rng.integers(args.seq // 2, args.seq + 1, size=args.batch)
    special = np.zeros_like(ids, dtype=bool)
    special[:, 0] = True
    for r, n in enumerate(lengths):
        special[r, n - 1:] = True
    p = args.probability

    def mask(inputs):
        inputs = inputs.copy()
        chosen = (rng.random(inputs.shape) < p) & ~special
        replaced = (rng.random(inputs.shape) < 0.8) & chosen
        inputs[replaced] = 103
        randomised = (rng.random(inputs.shape) < 0.5) & chosen & ~replaced
        inputs[randomised] = rng.integers(0, 30522, size=int(randomised.sum()))
        return inputs

    iters, start = 0, time.perf_counter()
    while True:
        mask(ids)
        iters += 1
        elapsed = time.perf_counter() - start
        if elapsed >= args.seconds and iters >= 3:
            break
    print(json.dumps({
        "baseline": "numpy vectorised MLM mask (HF collator algorithm)",
        "numpy": np.__version__,
        "batch": args.batch,
        "seq": args.seq,
        "iterations": iters,
        "tokens_per_s": iters * args.batch * args.seq / elapsed,
    }))


if __name__ == "__main__":
    main()

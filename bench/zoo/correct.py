"""A correct program: every rank seeded alike (as `set_seed(42)` does), and
drove's `worker_init_fn`, which seeds each worker's `random`, NumPy and torch
from its own (seed, rank, worker) stream. The watcher raises nothing.

    drove run --np 4 -- python bench/zoo/correct.py
"""

import random

import numpy as np
import torch

import drove.torch
import _mlm


def collate(rows):
    return _mlm.masked_batch(rows, random.random)


def main():
    args = _mlm.options(__doc__)
    random.seed(42)
    np.random.seed(42)
    torch.manual_seed(42)
    init = drove.torch.worker_init_fn(42, rank=_mlm.rank_and_world()[0])
    sampler, batches = _mlm.loader(_mlm.Sentences(), args, collate, init)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

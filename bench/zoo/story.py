"""The story, as PyTorch users write it today: `random`, NumPy and torch seeded
with 42 on every rank (what HuggingFace's `set_seed(42)` does), and 4 forked
loader workers masking with `random.random()` in the collate function.
PyTorch seeds worker k's `random` from a base seed it draws from torch's
generator: the same on every rank, so worker k masks alike on every rank.

    drove run --np 4 -- python bench/zoo/story.py          # the alarm
    drove run --np 4 -- python bench/zoo/story.py --fix    # drove's worker_init_fn: diverse
"""

import random

import numpy as np
import torch

import _mlm


def collate(rows):
    return _mlm.masked_batch(rows, random.random)


def main():
    args = _mlm.options(__doc__)
    random.seed(42)
    np.random.seed(42)
    torch.manual_seed(42)
    init = None
    if args.fix:
        import drove.torch

        init = drove.torch.worker_init_fn(42, rank=_mlm.rank_and_world()[0])
    sampler, batches = _mlm.loader(_mlm.Sentences(), args, collate, init)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

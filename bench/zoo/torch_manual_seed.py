"""`torch.manual_seed(42)` alone on every rank, augmentation drawn by torch in
the workers: PyTorch seeds worker k's torch generator from a base seed drawn
from the main process's, the same on every rank.

    drove run --np 4 -- python bench/zoo/torch_manual_seed.py         # the alarm
    drove run --np 4 -- python bench/zoo/torch_manual_seed.py --fix   # a seed per rank: diverse
"""

import torch

import _mlm


def draw():
    return float(torch.rand(()))


def collate(rows):
    return _mlm.masked_batch(rows, draw)


def main():
    args = _mlm.options(__doc__)
    rank, _ = _mlm.rank_and_world()
    torch.manual_seed(42 + rank if args.fix else 42)
    sampler, batches = _mlm.loader(_mlm.Sentences(), args, collate)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

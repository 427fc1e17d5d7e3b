"""Accelerate's `set_seed(42)` without `device_specific=True` on every rank
(it seeds `random`, NumPy and torch with 42 alike), 4 workers masking with
torch in the collate function: the story through Accelerate. (Needs
accelerate.)

    drove run --np 4 -- python bench/zoo/accelerate_set_seed.py         # the alarm
    drove run --np 4 -- python bench/zoo/accelerate_set_seed.py --fix   # device_specific=True: diverse
"""

import torch
from accelerate.utils import set_seed

import _mlm


def draw():
    return float(torch.rand(()))


def collate(rows):
    return _mlm.masked_batch(rows, draw)


def main():
    args = _mlm.options(__doc__)
    _mlm.rank_and_world()
    if args.fix:
        from accelerate import Accelerator

        Accelerator(cpu=True)  # device_specific reads the process index from its state
    set_seed(42, device_specific=args.fix)
    sampler, batches = _mlm.loader(_mlm.Sentences(), args, collate)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

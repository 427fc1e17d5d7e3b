"""Lightning's `seed_everything(42)` without `workers=True` on every rank: it
seeds `random`, NumPy and torch with 42 alike and leaves the loader workers
to PyTorch's seeding (with `workers=True`, Lightning's Trainer gives each
worker `pl_worker_init_function`, which adds the rank). NumPy masking in the
workers. (Needs lightning.)

    drove run --np 4 -- python bench/zoo/lightning_seed_everything.py         # the alarm
    drove run --np 4 -- python bench/zoo/lightning_seed_everything.py --fix   # workers=True and its init: diverse
"""

import numpy as np
from lightning.fabric.utilities.seed import pl_worker_init_function, seed_everything

import _mlm


def collate(rows):
    return _mlm.masked_batch(rows, np.random.random_sample)


def main():
    args = _mlm.options(__doc__)
    rank, _ = _mlm.rank_and_world()
    seed_everything(42, workers=args.fix, verbose=False)
    init = pl_worker_init_function if args.fix else None
    sampler, batches = _mlm.loader(_mlm.Sentences(), args, collate, init)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

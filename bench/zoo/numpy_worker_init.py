"""A `worker_init_fn` that seeds NumPy with `seed + worker_id` and no rank,
and augmentation drawn with `np.random` in the collate function: worker k of every rank
draws the same masks. (torch is not seeded here, so Python's `random` and
torch's generator differ across ranks; NumPy's is the one that matters.)

    drove run --np 4 -- python bench/zoo/numpy_worker_init.py         # the alarm
    drove run --np 4 -- python bench/zoo/numpy_worker_init.py --fix   # the rank in the seed: diverse
"""

import numpy as np

import _mlm

SEED = 42



def collate(rows):
    return _mlm.masked_batch(rows, np.random.random_sample)


def seed_worker(worker_id):
    np.random.seed(SEED + worker_id)


class SeedWorkerOfRank:
    """The fix: the rank in the seed too (a class, so spawn can pickle it)."""

    def __init__(self, rank):
        self.rank = rank

    def __call__(self, worker_id):
        np.random.seed([SEED, self.rank, worker_id])


def main():
    args = _mlm.options(__doc__)
    init = SeedWorkerOfRank(_mlm.rank_and_world()[0]) if args.fix else seed_worker
    sampler, batches = _mlm.loader(_mlm.Sentences(), args, collate, init)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

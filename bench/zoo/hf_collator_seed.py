"""HuggingFace's MLM collator with its own `seed=42` (transformers 5.x): it
seeds worker k's generator with `seed + k` and never the rank, so worker k of
every rank masks alike. No global stream is shared (each rank seeds
`seed + rank`), so only the masks themselves show it. (Needs transformers.)

    drove run --np 4 -- python bench/zoo/hf_collator_seed.py         # the alarm
    drove run --np 4 -- python bench/zoo/hf_collator_seed.py --fix   # the rank in the seed: diverse
"""

from transformers import DataCollatorForLanguageModeling, set_seed

import _mlm


def main():
    args = _mlm.options(__doc__)
    rank, _ = _mlm.rank_and_world()
    set_seed(42 + rank)
    blocks = _mlm.Blocks(_mlm.ROOT)
    seed = 42 + 1000 * rank if args.fix else 42
    collator = DataCollatorForLanguageModeling(blocks.tokenizer, mlm_probability=0.15, seed=seed)
    sampler, batches = _mlm.loader(blocks, args, collator)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

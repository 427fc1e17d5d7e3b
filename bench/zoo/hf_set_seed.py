"""HuggingFace's MLM collator under `set_seed(42)` on every rank, 4 loader
workers: the collator masks with torch's default generator, which PyTorch
seeds in worker k from a base seed drawn from the main process's, seeded
alike on every rank. (Needs transformers.)

    drove run --np 4 -- python bench/zoo/hf_set_seed.py         # the alarm
    drove run --np 4 -- python bench/zoo/hf_set_seed.py --fix   # drove's worker_init_fn: diverse
"""

from transformers import DataCollatorForLanguageModeling, set_seed

import _mlm


def main():
    args = _mlm.options(__doc__)
    set_seed(42)
    blocks = _mlm.Blocks(_mlm.ROOT)
    collator = DataCollatorForLanguageModeling(blocks.tokenizer, mlm_probability=0.15)
    init = None
    if args.fix:
        import drove.torch

        init = drove.torch.worker_init_fn(42, rank=_mlm.rank_and_world()[0])
    sampler, batches = _mlm.loader(blocks, args, collator, init)
    _mlm.train(args, sampler, batches)


if __name__ == "__main__":
    main()

"""Masking throughput through the drove Python package, beside HuggingFace's
DataCollatorForLanguageModeling and beside the story's plain-Python ``random.random()``
loop, on the same batches in the same run: interleaved rounds (the order rotates each
round), medians over rounds, ratios of the medians. Prints one JSON object.

    python bench/python_mask.py --batch 32 --seq 128 --rounds 5 --batches-per-round 20 --min-seconds 0.5

Run it through ``bash bench/python_mask.sh`` (which makes the venv with the pinned
numpy/transformers of bench/python-requirements.txt and installs the built wheel).

The batches are BERT-NER shaped: ``--batch`` rows x ``--seq`` positions, each row
[CLS] + random word-piece ids + [SEP] of a length drawn uniformly in [10, seq], padded
with [PAD] (fixed seed). Tokens are counted as rows x positions of each batch, as in
BENCHMARKS.md's other masking figures. Only the masking call is timed; the inputs each
side takes (NumPy arrays, a list of feature dicts, Python lists) are built beforehand.
In each round every side masks the same ``--batches-per-round`` batches, in passes,
until at least ``--min-seconds`` have gone by (so a fast side's round is not a few
milliseconds that one preemption can spoil); its rate is the tokens of its passes over
their time. A first, untimed pass checks each side's choices and warms it up.

- drove: ``drove.Masker(...).mask(ids, maskable, seed=, epoch=, samples=)`` on int64 /
  bool arrays; returns new (ids, actions) arrays.
- hf_collator: ``DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15,
  return_tensors="np", seed=42)(features)`` where features is a list of
  ``{"input_ids": [...], "special_tokens_mask": [...]}`` (lists, already padded to
  ``--seq``, as a tokenizer called with ``return_special_tokens_mask=True`` and
  ``padding="max_length"`` returns them). The call pads (a no-op here), converts to
  arrays and masks: what a DataLoader's collate_fn runs per batch.
- hf_mask_tokens: the collator's masking step alone, ``numpy_mask_tokens`` on a copy of
  the ready int64 array and the special-tokens mask (reported beside, not a headline).
- story_loop: for each position ``if random.random() < 0.15 and maskable``, then
  80/10/10 (mask token / ``random.randrange(vocab)`` / keep) with ``random.random()``,
  in plain Python over Python lists (``ids.tolist()``), writing a copy of each row and
  an actions row, as the story's collate_fn did (it indexed torch tensors element by
  element, which is slower than lists; lists are the generous form of the baseline).
"""
import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from importlib.metadata import version

import numpy as np

CLS, SEP, PAD, MASK = 101, 102, 0, 103
VOCAB = 30522
PROBABILITY = 0.15


def machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model


def loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def make_batches(n, rows, seq, seed):
    """n batches of rows x seq: [CLS] ids [SEP] [PAD]..., lengths uniform in [10, seq]."""
    rng = np.random.default_rng(seed)
    low = min(10, seq)
    out = []
    for b in range(n):
        lengths = rng.integers(low, seq + 1, size=rows)
        ids = np.full((rows, seq), PAD, dtype=np.int64)
        maskable = np.zeros((rows, seq), dtype=bool)
        for r, k in enumerate(lengths):
            ids[r, 0] = CLS
            ids[r, 1:k - 1] = rng.integers(1000, VOCAB, size=k - 2)
            ids[r, k - 1] = SEP
            maskable[r, 1:k - 1] = True
        special = (~maskable).astype(np.int64)
        out.append({
            "ids": ids,
            "maskable": maskable,
            "samples": np.arange(b * rows, (b + 1) * rows, dtype=np.int64),
            "special": special,
            "features": [{"input_ids": i, "special_tokens_mask": s}
                         for i, s in zip(ids.tolist(), special.tolist())],
            "ids_list": ids.tolist(),
            "maskable_list": maskable.tolist(),
            "real_tokens": int(lengths.sum()),
        })
    return out


def story_mask(ids_rows, maskable_rows, vocab):
    """The story's collate_fn masking, plain Python: returns (masked rows, action rows)."""
    rnd = random.random
    randrange = random.randrange
    masked, actions = [], []
    for ids, maskable in zip(ids_rows, maskable_rows):
        row = list(ids)
        acts = [0] * len(row)
        for j in range(len(row)):
            if rnd() < PROBABILITY and maskable[j]:
                u = rnd()
                if u < 0.8:
                    row[j] = MASK
                    acts[j] = 1
                elif u < 0.9:
                    row[j] = randrange(vocab)
                    acts[j] = 2
                else:
                    acts[j] = 3
        masked.append(row)
        actions.append(acts)
    return masked, actions


def load_tokenizer(assets):
    from transformers import BertTokenizerFast

    vocab = os.path.join(assets, "minilm", "vocab.txt")
    tokenizer_json = os.path.join(assets, "minilm", "tokenizer.json")
    if os.path.exists(vocab):
        # transformers 5.x: the argument is `vocab`; the 4.x name `vocab_file` is
        # silently ignored there (a 5-token tokenizer), hence the checks below.
        tok, source = BertTokenizerFast(vocab=vocab), "vocab.txt"
    elif os.path.exists(tokenizer_json):
        tok, source = BertTokenizerFast(tokenizer_file=tokenizer_json), "tokenizer.json"
    else:
        sys.exit(f"python_mask: no {vocab} nor {tokenizer_json}; run bash scripts/fetch-assets.sh")
    if len(tok) != VOCAB or tok.mask_token_id != MASK or tok.pad_token_id != PAD:
        sys.exit(f"python_mask: tokenizer from {source} has {len(tok)} tokens, "
                 f"[MASK]={tok.mask_token_id}, [PAD]={tok.pad_token_id}; expected {VOCAB}, {MASK}, {PAD}")
    return tok, source


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches-per-round", type=int, default=20,
                    help="distinct batches every side masks in each pass")
    ap.add_argument("--min-seconds", type=float, default=0.5,
                    help="a side repeats its pass over the batches within a round until this long")
    ap.add_argument("--seed", type=int, default=42, help="the batches' seed and every masker's")
    ap.add_argument("--assets", default=os.environ.get("DROVE_ASSETS", os.path.join(root, "assets")))
    args = ap.parse_args()
    if args.seq < 3 or args.batch < 1 or args.rounds < 1 or args.batches_per_round < 1:
        sys.exit("python_mask: need --seq >= 3 and --batch, --rounds, --batches-per-round >= 1")

    import drove
    import transformers
    import tokenizers
    from transformers import DataCollatorForLanguageModeling

    tok, tok_source = load_tokenizer(args.assets)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=PROBABILITY, return_tensors="np",
                                               seed=args.seed)
    masker = drove.Masker(mask_token=MASK, vocab_size=VOCAB, probability=PROBABILITY)
    random.seed(args.seed)  # the story: random.seed(42) before the loader

    batches = make_batches(args.batches_per_round, args.batch, args.seq, args.seed)
    tokens_per_pass = args.batches_per_round * args.batch * args.seq

    def run_drove(keep=None):
        for b in batches:
            out = masker.mask(b["ids"], b["maskable"], seed=args.seed, epoch=0, samples=b["samples"])
            if keep is not None:
                keep.append(out[1] != 0)

    def run_hf_collator(keep=None):
        for b in batches:
            out = collator(b["features"])
            if keep is not None:
                keep.append(out["labels"] != -100)

    def run_hf_mask_tokens(keep=None):
        for b in batches:
            _, labels = collator.numpy_mask_tokens(b["ids"].copy(), special_tokens_mask=b["special"])
            if keep is not None:
                keep.append(labels != -100)

    def run_story(keep=None):
        for b in batches:
            _, actions = story_mask(b["ids_list"], b["maskable_list"], VOCAB)
            if keep is not None:
                keep.append(np.array(actions) != 0)

    sides = [("drove", run_drove), ("hf_collator", run_hf_collator),
             ("hf_mask_tokens", run_hf_mask_tokens), ("story_loop", run_story)]

    # Check (untimed): each side chooses about 15% of the maskable positions and
    # nothing else; this pass also warms every side up.
    maskable_all = np.stack([b["maskable"] for b in batches])
    chosen_fraction = {}
    for name, fn in sides:
        keep = []
        fn(keep)
        chosen = np.stack(keep)
        if (chosen & ~maskable_all).any():
            sys.exit(f"python_mask: {name} chose a special or padding position")
        chosen_fraction[name] = float(chosen.sum() / maskable_all.sum())

    load_start = loadavg()
    per_round = {name: [] for name, _ in sides}
    passes = {name: [] for name, _ in sides}
    for r in range(args.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for name, fn in order:
            n, start = 0, time.perf_counter()
            while True:
                fn()
                n += 1
                elapsed = time.perf_counter() - start
                if elapsed >= args.min_seconds:
                    break
            per_round[name].append(n * tokens_per_pass / elapsed)
            passes[name].append(n)
    load_end = loadavg()

    med = {name: statistics.median(v) for name, v in per_round.items()}
    real = sum(b["real_tokens"] for b in batches)
    print(json.dumps({
        "machine": machine(),
        "cores": os.cpu_count(),
        "loadavg_1min_start_end": [load_start, load_end],
        "python": platform.python_version(),
        "numpy": np.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "drove": version("drove"),
        "tokenizer": f"BertTokenizerFast from assets/minilm/{tok_source} ({len(tok)} tokens)",
        "batch": args.batch,
        "seq": args.seq,
        "rounds": args.rounds,
        "batches_per_round": args.batches_per_round,
        "min_seconds": args.min_seconds,
        "tokens_per_batch": args.batch * args.seq,
        "real_token_fraction": real / (args.batches_per_round * args.batch * args.seq),
        "probability": PROBABILITY,
        "drove_tokens_per_s": med["drove"],
        "hf_collator_tokens_per_s": med["hf_collator"],
        "hf_mask_tokens_tokens_per_s": med["hf_mask_tokens"],
        "story_loop_tokens_per_s": med["story_loop"],
        "drove_vs_hf": med["drove"] / med["hf_collator"],
        "drove_vs_hf_mask_tokens": med["drove"] / med["hf_mask_tokens"],
        "drove_vs_story": med["drove"] / med["story_loop"],
        "hf_vs_story": med["hf_collator"] / med["story_loop"],
        "chosen_fraction_of_maskable": chosen_fraction,
        "per_round_tokens_per_s": per_round,
        "per_round_passes": passes,
    }, indent=1))


if __name__ == "__main__":
    main()

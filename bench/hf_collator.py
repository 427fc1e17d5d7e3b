"""HuggingFace's MLM collator as the story uses it, on 4 ranks: every rank a
real process that calls ``transformers.set_seed(42)`` (what the HF examples
do on every rank), tokenizes its own shard of CoNLL-2003 (sentences r, r+4,
...) and masks one batch with ``DataCollatorForLanguageModeling``. Their
masks are compared by drove's diagnostic (``drove.agreement``): independent
masks agree at about ``drove.expected_agreement``; the story's agree at 1.0.
Prints one JSON object.

    bash bench/hf_collator.sh [--ranks 4] [--batch 32] [--seq 64]

The collator returns NumPy arrays (``return_tensors="np"``: its masking draws
from NumPy's global state, which ``set_seed`` seeds) so no torch is needed;
with ``"pt"`` it draws from torch's, which ``set_seed`` seeds the same way.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

PROBABILITY = 0.15


def read_conll(path):
    sentences, words = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("-DOCSTART-"):
                if words:
                    sentences.append(words)
                words = []
            else:
                words.append(line.split()[0])
    if words:
        sentences.append(words)
    return sentences


def rank_masks(args):
    """One rank: its batch's chosen and maskable positions, as lists."""
    import transformers
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

    transformers.set_seed(42)  # the story, on every rank
    tok = BertTokenizerFast(vocab=os.path.join(args.assets, "minilm", "vocab.txt"))
    sentences = read_conll(os.path.join(args.assets, "conll2003", "train.txt"))
    shard = sentences[args.rank::args.ranks][: args.batch]
    enc = tok(shard, is_split_into_words=True, truncation=True, max_length=args.seq, padding="max_length",
              return_special_tokens_mask=True)
    features = [{"input_ids": ids, "special_tokens_mask": special}
                for ids, special in zip(enc["input_ids"], enc["special_tokens_mask"])]
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=PROBABILITY, return_tensors="np")
    batch = collator(features)
    chosen = batch["labels"] != -100
    maskable = np.array(enc["special_tokens_mask"]) == 0
    return {"chosen": chosen.tolist(), "maskable": maskable.tolist(), "transformers": transformers.__version__}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--assets", default=os.environ.get("DROVE_ASSETS", os.path.join(root, "assets")))
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # one rank's process
    args = ap.parse_args()
    if args.ranks < 2 or args.batch < 1 or args.seq < 3:
        sys.exit("hf_collator: need --ranks >= 2, --batch >= 1, --seq >= 3")
    if args.rank is not None:
        print(json.dumps(rank_masks(args)))
        return
    import drove

    ranks = []
    for r in range(args.ranks):
        out = subprocess.run([sys.executable, __file__, "--rank", str(r), "--ranks", str(args.ranks),
                              "--batch", str(args.batch), "--seq", str(args.seq), "--assets", args.assets],
                             check=True, capture_output=True, text=True, timeout=600).stdout
        ranks.append(json.loads(out))
    chosen = np.array([r["chosen"] for r in ranks], dtype=bool)
    maskable = np.array([r["maskable"] for r in ranks], dtype=bool)
    report = drove.agreement(chosen, maskable, probability=PROBABILITY)
    print(json.dumps({
        "bench": "hf_collator",
        "ranks": args.ranks, "batch": args.batch, "seq": args.seq,
        "seeding": "transformers.set_seed(42) on every rank",
        "collator": "DataCollatorForLanguageModeling(mlm_probability=0.15, return_tensors='np')",
        "transformers": ranks[0]["transformers"],
        "agreement": report.to_dict(),
        "expected_if_independent": drove.expected_agreement(PROBABILITY),
    }))


if __name__ == "__main__":
    main()

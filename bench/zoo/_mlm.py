"""What the zoo's programs share: a synthetic corpus and HuggingFace's MLM
batch convention (``input_ids``, ``attention_mask``, ``labels`` with -100 at
the tokens left unmasked), and the command line each program takes.

Nothing here draws a random number: each program draws its own masks, the
way its users write it.
"""

import argparse
import os

import torch

PAD, CLS, SEP, MASK, VOCAB = 0, 101, 102, 103, 1000
PROBABILITY = 0.15
# Every batch padded to this length, as `tokenizer(..., padding="max_length")` does.
MAX_LENGTH = 64


def options(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--fix", action="store_true", help="apply the fix this form needs")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=12, help="batches a rank takes each epoch")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    return p.parse_args()


def rank_and_world():
    """This rank and the world's size, from torchrun's variables (drove run sets them too),
    with the gloo process group a data-parallel program forms."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    return rank, world


class Sentences(torch.utils.data.Dataset):
    """Sentence i: 12 to 47 tokens between [CLS] and [SEP], fixed by i alone."""

    def __len__(self):
        return 4096

    def __getitem__(self, i):
        length = 12 + (i * 7919) % 36
        return [CLS] + [200 + (i * 31 + j * 17) % (VOCAB - 200) for j in range(length)] + [SEP]


def pad(rows):
    """Rows padded to MAX_LENGTH: (input_ids, attention_mask) as long tensors."""
    width = MAX_LENGTH
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        attention[i, : len(r)] = 1
    return ids, attention


def masked_batch(rows, draw):
    """HuggingFace's MLM batch: three numbers drawn for every position of the
    padded batch (as ``np.random.rand(*ids.shape)`` would); a token between
    [CLS] and [SEP] is chosen when the first is below 0.15, then becomes
    [MASK] (second below 0.8), a token from the third (below 0.9), or stays."""
    ids, attention = pad(rows)
    labels = torch.full_like(ids, -100)
    for i, r in enumerate(rows):
        for j in range(MAX_LENGTH):
            chance, action, token = draw(), draw(), draw()
            if 0 < j < len(r) - 1 and chance < PROBABILITY:
                labels[i, j] = ids[i, j]
                if action < 0.8:
                    ids[i, j] = MASK
                elif action < 0.9:
                    ids[i, j] = 200 + int(token * (VOCAB - 200))
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def loader(dataset, args, collate_fn, worker_init_fn=None):
    """A DistributedSampler's share of the corpus for this rank, as users build it."""
    rank, world = rank_and_world()
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    return sampler, torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        collate_fn=collate_fn,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=args.start_method if args.workers > 0 else None,
    )


def train(args, sampler, batches):
    """The epochs' loop, a stand-in for the model's step (the watcher only sees the loader)."""
    rank, _ = rank_and_world()
    masked = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, batch in enumerate(batches):
            if step == args.batches:
                break
            masked += int((batch["labels"] != -100).sum())
    print("rank %d: %d epochs, %d tokens masked" % (rank, args.epochs, masked), flush=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class Blocks(torch.utils.data.Dataset):
    """CoNLL-2003's training sentences tokenized by MiniLM's tokenizer and
    cut into blocks of MAX_LENGTH tokens, as HuggingFace's run_mlm.py
    `group_texts` does: every example the same length, so every rank's
    batch has one shape. (For the zoo's HuggingFace forms; needs
    transformers and the assets scripts/fetch-assets.sh fetches.)"""

    def __init__(self, root):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(os.path.join(root, "assets", "minilm"))
        words = []
        with open(os.path.join(root, "assets", "conll2003", "train.txt"), encoding="utf-8") as f:
            for line in f:
                if line.strip() and not line.startswith("-DOCSTART-"):
                    words.append(line.split()[0])
                if len(words) >= 40000:
                    break
        ids = self.tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
        self.blocks = [ids[i : i + MAX_LENGTH] for i in range(0, len(ids) - MAX_LENGTH + 1, MAX_LENGTH)]

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i]}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

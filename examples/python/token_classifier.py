"""A small token classifier trained on N ranks with drove's seeding, masking,
diagnostic and metrics: the story's data path in PyTorch, and its fix.

    drove run --np 4 --store runs/py/store -- python3 examples/python/token_classifier.py
    drove run --np 4 --store runs/py/store -- python3 examples/python/token_classifier.py --seeding story

Every rank prints one JSON line per diagnostic step. ``--seeding story`` is
the story's bug exactly: every process calls ``random.seed(42)``,
``np.random.seed(42)`` and ``torch.manual_seed(42)``, and a DataLoader's
forked workers mask 15% of each batch's positions with ``random.random()``;
the masks agree across ranks 100% of the time and drove's alarm goes off.
``--seeding drove`` (the default) changes three lines: drove's
``worker_init_fn``, drove's ``DistributedSampler`` and, with
``--masker drove``, per-sample masks from ``drove.torch.MaskedDataset``.
"""

import argparse
import json
import random
import sys
from typing import Dict, List, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.data

import drove
import drove.torch

VOCAB = 1000
PAD, CLS, SEP, MASK = 0, 1, 2, 3
SPECIAL = (PAD, CLS, SEP)
CLASSES = 5
PROBABILITY = 0.15


class Sentences(torch.utils.data.Dataset):
    """Synthetic sentences of 8..seq_len-2 tokens between [CLS] and [SEP]; a token's class is id mod 5."""

    def __init__(self, n: int, seq_len: int) -> None:
        rng = np.random.default_rng(7)  # the data, the same on every rank
        lengths = rng.integers(8, seq_len - 1, size=n)
        self.rows = [np.concatenate(([CLS], rng.integers(4, VOCAB, size=k), [SEP])) for k in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Dict[str, np.ndarray]:
        ids = self.rows[i]
        labels = np.where(np.isin(ids, SPECIAL), -100, ids % CLASSES)
        return {"input_ids": ids, "labels": labels}


class StoryCollate:
    """The story's collate function: pads to ``seq_len`` and masks each position with ``random.random()``."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def __call__(self, samples: List[Dict[str, np.ndarray]]) -> Tuple[torch.Tensor, ...]:
        ids = torch.full((len(samples), self.seq_len), PAD, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        for r, s in enumerate(samples):
            ids[r, : len(s["input_ids"])] = torch.as_tensor(s["input_ids"])
            labels[r, : len(s["labels"])] = torch.as_tensor(s["labels"])
        maskable = ~torch.isin(ids, torch.tensor(SPECIAL))
        mask = torch.zeros_like(maskable)
        for r in range(ids.shape[0]):
            for j in range(self.seq_len):
                if random.random() < PROBABILITY and maskable[r, j]:
                    mask[r, j] = True
        ids[mask] = MASK
        return ids, labels, mask, maskable


class DroveCollate:
    """Pads samples that ``MaskedDataset`` already masked, each from its own stream."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def __call__(self, samples: List[Dict[str, torch.Tensor]]) -> Tuple[torch.Tensor, ...]:
        ids = torch.full((len(samples), self.seq_len), PAD, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        for r, s in enumerate(samples):
            n = len(s["input_ids"])
            ids[r, :n] = s["input_ids"]
            labels[r, :n] = torch.as_tensor(s["labels"])
            mask[r, :n] = s["mask"]
        maskable = ~torch.isin(ids, torch.tensor(SPECIAL)) | mask
        return ids, labels, mask, maskable


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.Conv1d(32, 32, kernel_size=3, padding=1)
        self.head = torch.nn.Linear(32, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + torch.relu(self.mix(x.transpose(1, 2))).transpose(1, 2)
        return self.head(x)


def options(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeding", choices=("story", "drove"), default="drove")
    p.add_argument("--masker", choices=("story", "drove"), default="story",
                   help="story: random.random() in the collate function; drove: per-sample streams")
    p.add_argument("--start-method", choices=("fork", "spawn"), default="fork")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--sentences", type=int, default=2048)
    p.add_argument("--diagnose-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def loader(args: argparse.Namespace, rank: int, world: int) -> torch.utils.data.DataLoader:
    data: torch.utils.data.Dataset = Sentences(args.sentences, args.seq_len)
    if args.seeding == "story":
        sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, seed=args.seed)
        init = None
    else:
        # As the README shows: the rank and world come from torch.distributed.
        sampler = drove.torch.DistributedSampler(data, seed=args.seed)
        init = drove.torch.worker_init_fn(args.seed)
    if args.masker == "drove":
        masker = drove.Masker(mask_token=MASK, vocab_size=VOCAB, probability=PROBABILITY)
        data = drove.torch.MaskedDataset(data, masker, seed=args.seed, special_tokens=SPECIAL)
        collate = DroveCollate(args.seq_len)
    else:
        collate = StoryCollate(args.seq_len)
    context = args.start_method if args.workers > 0 else None
    return torch.utils.data.DataLoader(
        data, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
        collate_fn=collate, worker_init_fn=init, multiprocessing_context=context,
    )


def main(argv: List[str]) -> int:
    args = options(argv)
    # The story: every process seeds every library with the same number.
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = Tagger()
    for p in model.parameters():  # the same start on every rank
        dist.broadcast(p.data, src=0)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    metrics = drove.recorder()
    data = loader(args, rank, world)
    step, epoch = 0, 0
    while step < args.steps:
        data.sampler.set_epoch(epoch)
        if isinstance(data.dataset, drove.torch.MaskedDataset):
            data.dataset.set_epoch(epoch)
        for ids, labels, mask, maskable in data:
            loss = F.cross_entropy(model(ids).reshape(-1, CLASSES), labels.reshape(-1), ignore_index=-100)
            optimiser.zero_grad()
            loss.backward()
            if step % args.diagnose_every == 0:
                masks = drove.torch.mask_agreement(mask, maskable, probability=PROBABILITY, step=step)
                cosine = drove.torch.grad_cosine(model.head.weight, step=step)
                report = masks.to_dict() if masks is not None else None
                print(json.dumps({"rank": rank, "step": step, "masks": report, "grad_cosine": cosine.mean}),
                      flush=True)
            for p in model.parameters():  # Horovod's step: average, then apply
                dist.all_reduce(p.grad)
                p.grad /= world
            optimiser.step()
            if metrics is not None:
                metrics.record(step, drove.metric_names["LOSS"], loss.item())
            step += 1
            drove.progress(step, args.steps, epoch=epoch, loss=loss.item())  # drove run's bar, from rank 0
            if step >= args.steps:
                break
        epoch += 1
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

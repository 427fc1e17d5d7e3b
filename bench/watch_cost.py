"""The watcher's cost on a real training program: MiniLM fine-tuned on
CoNLL-2003 as bench/pytorch_ner.py trains it (batch 32, max length 128,
AdamW, linear schedule, clipping at 1.0), its batches fetched by a DataLoader
with 2 workers, timed with and without drove's watcher in one process.

    python bench/watch_cost.py --steps 20 --rounds 4      # one JSON line
    python bench/watch_cost.py --steps 20 --rounds 4 --same   # A/A: the noise floor

Each round times `--steps` training steps unwatched and as many watched
(the watcher `drove run` carries, patched into torch's DataLoader, its notes
sent to a socket read here), in ABBA order, so both see the same machine. A step is the
batch's fetch and the model's forward, backward and update. Each round also
times the loader alone (no model) each way: the watcher's own time per
batch, which step times on a shared machine are too noisy to resolve; and
it times the watcher's own work in the main process where it is done (the
batch's MLM check, fingerprints, sending a note). The JSON gives all three,
and the watcher's own time a batch as a fraction of the median step.

Needs torch, transformers and the drove package (for the watcher's source).
"""

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_ner as ner  # noqa: E402

ner.torch = torch  # pytorch_ner imports torch in its main(), after its arguments


class Sentences(torch.utils.data.Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class Collate:
    def __init__(self, pad):
        self.pad = pad

    def __call__(self, batch):
        ids, mask, labels = ner.collate(batch, self.pad)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def watcher():
    """drove's watcher, patched in on demand: (watch, unwatch)."""
    from drove.watch import _core

    core = _core()
    sock_dir = tempfile.mkdtemp(prefix="drove-watch-cost-")
    path = os.path.join(sock_dir, "notes.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    receiver.setblocking(False)
    os.environ[core.SOCKET] = path
    module = torch.utils.data.dataloader
    originals = (module.DataLoader.__iter__, module._BaseDataLoaderIter.__next__)
    # The watcher's own work in this (the main) process, timed where it is
    # done: the MLM check of a batch, fingerprints, sending a note.
    spent = {"seconds": 0.0, "calls": 0}
    for name in ("_mask_note", "fingerprints", "send"):
        inner = getattr(core, name)

        def timed(*a, _inner=inner, **k):
            t0 = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                spent["seconds"] += time.perf_counter() - t0
                spent["calls"] += 1

        setattr(core, name, timed)

    def watch():
        module.DataLoader._drove_watched = False
        core.patch(module)

    def unwatch():
        module.DataLoader.__iter__, module._BaseDataLoaderIter.__next__ = originals
        module.DataLoader._drove_watched = False
        notes = 0
        while True:
            try:
                receiver.recv(1 << 20)
                notes += 1
            except BlockingIOError:
                return notes

    return watch, unwatch, spent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="assets/conll2003")
    ap.add_argument("--model", default="assets/minilm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--same", action="store_true",
                    help="an A/A run: both sides unwatched, the noise floor of the step ratio")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    data = ner.encode(tokenizer, ner.read_conll(os.path.join(args.data, "train.txt")), 128)
    torch.manual_seed(42)
    model = AutoModelForTokenClassification.from_pretrained(args.model, num_labels=len(ner.LABELS))
    optim = torch.optim.AdamW(model.parameters(), lr=5e-5)
    loader = torch.utils.data.DataLoader(Sentences(data), batch_size=32, shuffle=True,
                                         num_workers=args.workers, collate_fn=Collate(tokenizer.pad_token_id))
    watch, unwatch, spent = watcher()
    if args.same:
        watch, unwatch = (lambda: None), (lambda: 0)

    def steps(train):
        times = []
        batches = iter(loader)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            batch = next(batches)
            if train:
                loss = model(**batch).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optim.step()
                optim.zero_grad()
            times.append(time.perf_counter() - t0)
        return times[1:]  # the first waits for the workers to start

    rounds, notes = [], 0
    steps(True)  # warm-up: the first steps allocate
    for r in range(args.rounds):
        # ABBA: odd rounds time the watched steps first, so that neither
        # side always runs second.
        if r % 2:
            watch()
            watched = steps(True)
            notes += unwatch()
            unwatched = steps(True)
        else:
            unwatched = steps(True)
            watch()
            watched = steps(True)
            notes += unwatch()
        fetch_plain = steps(False)
        watch()
        fetch_watched = steps(False)
        notes += unwatch()
        rounds.append((unwatched, watched, fetch_plain, fetch_watched))
    flat = [sum((r[k] for r in rounds), []) for k in range(4)]
    step = statistics.median(flat[0])
    per_batch = statistics.median(flat[3]) - statistics.median(flat[2])
    print(json.dumps({
        "benchmark": "watch_cost", "same": args.same, "torch": torch.__version__, "steps_per_round": args.steps,
        "rounds": args.rounds, "workers": args.workers,
        "step_median_unwatched_s": step, "step_median_watched_s": statistics.median(flat[1]),
        "step_ratio_watched": statistics.median(flat[1]) / step,
        "step_ratio_by_round": [statistics.median(r[1]) / statistics.median(r[0]) for r in rounds],
        "fetch_median_unwatched_s": statistics.median(flat[2]),
        "fetch_median_watched_s": statistics.median(flat[3]),
        "loader_difference_per_batch_s": per_batch,
        "watcher_main_seconds": spent["seconds"], "watcher_main_calls": spent["calls"],
        "watched_batches": 2 * args.rounds * args.steps,
        "watcher_main_per_batch_s": spent["seconds"] / (2 * args.rounds * args.steps),
        "watcher_fraction_of_step": spent["seconds"] / (2 * args.rounds * args.steps) / step,
        "notes": notes,
    }), flush=True)


if __name__ == "__main__":
    main()

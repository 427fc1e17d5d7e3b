"""The reference recipe in PyTorch/transformers, for side-by-side comparison with
`drove train ner` / `drove bench train`.

MiniLM-L6 + a token-classification head on CoNLL-2003 train; AdamW lr 5e-5,
weight decay 0.01 (not on biases and LayerNorm weights, as transformers'
Trainer), linear schedule with 10% warmup, gradient clipping at norm 1.0,
batch 32, max length 128, first-subword labels, dynamic padding, no augmentation.

    python bench/pytorch_ner.py --steps 20            # throughput, one JSON line
    python bench/pytorch_ner.py --epochs 3            # full fine-tune, test F1 per epoch
    python bench/pytorch_ner.py --device cuda --steps 200 --bucket-window 16   # on a GPU
    python bench/pytorch_ner.py --device cuda --fused-adamw --batch-size 256 --steps 300   # cycles epochs
    python bench/pytorch_ner.py --device cuda --fused-adamw --batch-size 32,256 --tf32 both --steps 40

With --steps the run goes on over as many epochs as the steps need (CoNLL-2003
train is ~14k sentences: 55 steps of 256), its linear schedule spanning the
warm-up and timed steps; the JSON line then names the first step's seconds,
the mean and median step and the peak GPU memory torch allocated and reserved
(reset for each run). --tf32 allows TF32 in matmuls and cuDNN
(`torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`;
off: eager f32, PyTorch's default). Several batch sizes, or `--tf32 both`, run
one after another in the one process (the data tokenized once, the model
loaded again and every seed reset for each run, so each run is the one a
process of its own would make), one JSON line each: TF32 off at every batch
size first, then on.

The arguments are read before torch is imported: `--check-args` checks them
and prints the runs they ask for without torch (the GPU check parses its
command lines so before it takes a GPU).

Needs torch and transformers (`pip install -r bench/requirements.txt`); entity F1
is seqeval's when it is installed, else the same measure (exact-match entity
spans, micro-averaged, IOB2) computed here.
"""

import argparse
import gc
import itertools
import json
import os
import random
import statistics
import time

# torch and transformers are imported by main() once the arguments are read.
torch = None

LABELS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


def read_conll(path):
    sentences, words, tags = [], [], []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line or line.startswith("-DOCSTART-"):
            if words:
                sentences.append((words, tags))
                words, tags = [], []
            continue
        cols = line.split()
        words.append(cols[0])
        tags.append(cols[-1])
    if words:
        sentences.append((words, tags))
    # IOB1 -> IOB2, as drove's reader does.
    for _, t in sentences:
        prev = "O"
        for i, tag in enumerate(t):
            if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
                t[i] = "B-" + tag[2:]
            prev = t[i]
    return sentences


def encode(tokenizer, sentences, max_len):
    out = []
    for words, tags in sentences:
        enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=max_len)
        labels, prev = [], None
        for w in enc.word_ids():
            labels.append(-100 if w is None or w == prev else LABELS.index(tags[w]))
            prev = w
        out.append((enc["input_ids"], labels, enc.word_ids()))
    return out


def collate(batch, pad_id):
    width = max(len(ids) for ids, _, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, (x, y, _) in enumerate(batch):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
        labels[i, : len(y)] = torch.tensor(y)
    return ids, mask, labels


def epoch_batches(lengths, batch_size, bucket_window, rng=random):
    """One epoch's batches (lists of indices into the data): a shuffled order
    cut into batches, or with `bucket_window` > 0 drove's bucketing (sort
    windows of that many batches by length, shuffle the full batches, the
    short last one last). Draws from `rng` (the `random` module: the seeded
    global stream) as the loop always did."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    steps = (len(order) + batch_size - 1) // batch_size
    cuts = [order[b * batch_size : (b + 1) * batch_size] for b in range(steps)]
    if bucket_window > 0 and cuts:
        window = bucket_window * batch_size
        cuts = []
        for start in range(0, len(order), window):
            chunk = sorted(order[start : start + window], key=lambda i: lengths[i])
            cuts.extend(chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size))
        full = cuts[:-1] if len(cuts[-1]) < batch_size else cuts
        rng.shuffle(full)
        cuts = full + cuts[len(full):]
    return cuts


def entities(tags):
    """The (type, start, end) spans of IOB2 tags, as seqeval reads them."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        if start is not None and (tag == "O" or tag.startswith("B-") or tag[2:] != kind):
            spans.add((kind, start, i))
            start, kind = None, None
        if tag.startswith("B-") or (tag.startswith("I-") and start is None):
            start, kind = i, tag[2:]
    return spans


def entity_f1(gold, pred):
    try:
        from seqeval.metrics import f1_score
        return f1_score(gold, pred)
    except ImportError:
        tp = n_gold = n_pred = 0
        for g, p in zip(gold, pred):
            g, p = entities(g), entities(p)
            tp, n_gold, n_pred = tp + len(g & p), n_gold + len(g), n_pred + len(p)
        precision = tp / n_pred if n_pred else 0.0
        recall = tp / n_gold if n_gold else 0.0
        return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def evaluate(model, data, sentences, pad_id, device="cpu"):
    model.eval()
    gold, pred = [], []
    with torch.no_grad():
        for start in range(0, len(data), 64):
            chunk = data[start : start + 64]
            ids, mask, _ = collate(chunk, pad_id)
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.argmax(-1).cpu()
            for r, (_, labels, word_ids) in enumerate(chunk):
                words, tags = sentences[start + r]
                p = ["O"] * len(words)
                for t, (w, y) in enumerate(zip(word_ids, labels)):
                    if w is not None and y != -100:
                        p[w] = LABELS[logits[r, t]]
                gold.append(tags)
                pred.append(p)
    model.train()
    return entity_f1(gold, pred)


def parse_args(argv=None):
    """The arguments, checked without torch: `--batch-size` as a list of
    sizes, `--tf32` as the list of settings to run (False, then True)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="assets/conll2003")
    ap.add_argument("--model", default="assets/minilm")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0,
                    help="time this many steps after the warm-up steps, then stop (over as many epochs as they take)")
    ap.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first (with --steps)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", default="32",
                    help="sentences a step; with --steps a comma-separated list runs each size in turn")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--bucket-window", type=int, default=0,
                    help="sort windows of N batches by length, then shuffle the batches (drove's bucketing; 0: off)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--random-init", action="store_true",
                    help="random weights of config.json's shape (where the weights did not travel)")
    ap.add_argument("--fused-adamw", action="store_true",
                    help="torch's fused AdamW (AdamW(fused=True); CUDA only)")
    ap.add_argument("--tf32", nargs="?", const="on", default="off", choices=["off", "on", "both"],
                    help="TF32 in matmuls and cuDNN (allow_tf32); `--tf32` alone is `on`; `both` runs off, then on "
                         "(with --steps)")
    ap.add_argument("--check-args", action="store_true",
                    help="check the arguments, print the runs they ask for as JSON and exit (no torch needed)")
    args = ap.parse_args(argv)
    try:
        args.batch_sizes = [int(b) for b in args.batch_size.split(",")]
    except ValueError:
        ap.error(f"--batch-size {args.batch_size!r}: expected a size or comma-separated sizes")
    if any(b < 1 for b in args.batch_sizes):
        ap.error(f"--batch-size {args.batch_size!r}: sizes are at least 1")
    args.tf32_runs = {"off": [False], "on": [True], "both": [False, True]}[args.tf32]
    if not args.steps and (len(args.batch_sizes) > 1 or len(args.tf32_runs) > 1):
        ap.error("several batch sizes or --tf32 both need --steps (a throughput run)")
    if args.fused_adamw and not args.device.startswith("cuda"):
        ap.error(f"--fused-adamw needs --device cuda (found --device {args.device}): "
                 "the check compares it on CUDA only")
    return args


def median(values):
    return statistics.median(values) if values else None


def main():
    args = parse_args()
    if args.check_args:
        print(json.dumps({"runs": [{"batch_size": b, "tf32": t} for t in args.tf32_runs for b in args.batch_sizes],
                          "steps": args.steps, "warmup_steps": args.warmup_steps}))
        return
    global torch
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, get_linear_schedule_with_warmup

    device = torch.device(args.device)
    on_gpu = device.type == "cuda"

    def sync():
        if on_gpu:
            torch.cuda.synchronize()
    torch.set_num_threads(args.threads)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train = read_conll(os.path.join(args.data, "train.txt"))
    data = encode(tokenizer, train, 128)
    lengths = [len(ids) for ids, _, _ in data]
    pad = tokenizer.pad_token_id
    if not data:
        raise SystemExit(f"no training sentences in {os.path.join(args.data, 'train.txt')}")
    # What the CUDA context itself holds (outside torch's allocator), so that
    # a peak can be set beside nvidia-smi's view of another process.
    context_bytes = None
    if on_gpu:
        torch.cuda.init()
        torch.zeros(1, device=device)
        free, total = torch.cuda.mem_get_info(device)
        context_bytes = total - free - torch.cuda.memory_reserved(device)

    def set_tf32(on):
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on

    def fresh(batch_size):
        """The model and optimizer as a process of their own would start them."""
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        if args.random_init:
            from transformers import AutoConfig
            config = AutoConfig.from_pretrained(args.model, num_labels=len(LABELS))
            model = AutoModelForTokenClassification.from_config(config)
        else:
            model = AutoModelForTokenClassification.from_pretrained(args.model, num_labels=len(LABELS))
        model.to(device)
        no_decay = ["bias", "LayerNorm.weight"]
        groups = [
            {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
             "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
        ]
        optim = (torch.optim.AdamW(groups, lr=5e-5, fused=True) if args.fused_adamw
                 else torch.optim.AdamW(groups, lr=5e-5))
        return model, optim

    def memory():
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if on_gpu else None,
            "gpu_max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device) if on_gpu else None,
            "gpu_max_memory_reserved_bytes": torch.cuda.max_memory_reserved(device) if on_gpu else None,
            "cuda_context_bytes": context_bytes,
        }

    def run(batch_size, tf32):
        """One run: timed steps (one JSON line), or epochs with test F1."""
        set_tf32(tf32)
        if on_gpu:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        model, optim = fresh(batch_size)
        steps_per_epoch = (len(data) + batch_size - 1) // batch_size
        if args.steps:
            # As many epochs as the steps take; the schedule spans exactly them.
            total = args.warmup_steps + args.steps
            epochs = itertools.count()
        else:
            total = steps_per_epoch * args.epochs
            epochs = range(args.epochs)
        schedule = get_linear_schedule_with_warmup(optim, int(0.1 * total), total)
        model.train()
        timed, sentences, tokens, step = 0.0, 0, 0, 0
        step_seconds, step_sps = [], []
        first_step_seconds = None
        history = []
        for epoch in epochs:
            cuts = epoch_batches(lengths, batch_size, args.bucket_window)
            for b in range(steps_per_epoch):
                batch = [data[i] for i in cuts[b]]
                ids, mask, labels = collate(batch, pad)
                sync()
                t0 = time.perf_counter()
                ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optim.step()
                schedule.step()
                optim.zero_grad()
                sync()
                dt = time.perf_counter() - t0
                step += 1
                if step == 1:
                    first_step_seconds = dt
                if step > args.warmup_steps:
                    timed += dt
                    sentences += len(batch)
                    tokens += int(mask.sum())
                    step_seconds.append(dt)
                    step_sps.append(len(batch) / dt)
                if args.steps and step >= total:
                    result = {
                        "benchmark": "train", "implementation": "pytorch", "torch": torch.__version__,
                        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
                        "threads": args.threads, "batch_size": batch_size, "steps_timed": step - args.warmup_steps,
                        "warmup_steps": args.warmup_steps, "bucket_window": args.bucket_window,
                        "random_init": args.random_init, "fused_adamw": args.fused_adamw, "tf32": tf32,
                        "steps_per_epoch": steps_per_epoch, "epochs_covered": step / steps_per_epoch,
                        "first_step_seconds": first_step_seconds,
                        "sentences_per_s": sentences / timed, "tokens_per_s": tokens / timed,
                        "median_sentences_per_s": median(step_sps),
                        "step_mean_seconds": timed / len(step_seconds), "step_median_seconds": median(step_seconds),
                        **memory(),
                    }
                    print(json.dumps(result), flush=True)
                    return
            if not args.steps:
                test = read_conll(os.path.join(args.data, "test.txt"))
                f1 = evaluate(model, encode(tokenizer, test, 128), test, pad, device)
                history.append({"epoch": epoch + 1, "test_f1": f1})
                print(json.dumps(history[-1]), flush=True)
        print(json.dumps({"implementation": "pytorch", "history": history, "fused_adamw": args.fused_adamw,
                          "tf32": tf32, "batch_size": batch_size, "first_step_seconds": first_step_seconds,
                          "sentences_per_s": sentences / timed, "tokens_per_s": tokens / timed,
                          "median_sentences_per_s": median(step_sps), "step_mean_seconds": timed / len(step_seconds),
                          "step_median_seconds": median(step_seconds), **memory()}), flush=True)

    for tf32 in args.tf32_runs:
        for batch_size in args.batch_sizes:
            run(batch_size, tf32)


if __name__ == "__main__":
    main()

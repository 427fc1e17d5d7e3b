"""The torchrun side of bench/elastic_recovery.sh: a DDP fine-tune of MiniLM-L6 for
NER on a CoNLL-2003 slice (gloo, CPU) that checkpoints every C steps and, as
torchrun's elastic examples do, reloads the latest checkpoint on every (re)start.

    torchrun --nnodes 1:1 --nproc-per-node 4 --max-restarts 1 --rdzv-backend c10d \
        --rdzv-endpoint 127.0.0.1:29400 bench/torchrun_elastic.py \
        --max-train-sentences 160 --batch-size 2 --checkpoint-every 4 \
        --checkpoint-dir /tmp/ckpt --fail-at-step 10 --rank-to-fail 3

`--fail-at-step K --rank-to-fail R`: rank R SIGKILLs itself after step K, in the
first incarnation only (TORCHELASTIC_RESTART_COUNT 0), so torchrun restarts the
whole worker group once and it resumes from the last checkpoint.

Each line on stderr starts with the wall time (seconds since the epoch) and the
rank: one on start ("started from step 0" or "resumed from step X"), one per
applied step on rank 0 ("step N/T world W loss L S sent/s"), one per checkpoint.
Sentences/s counts the global batch (batch x world) over the step's compute and
all-reduce (forward to optimizer step), not the batch's collation.

The encoding and collation are bench/pytorch_ner.py's; the recipe (AdamW,
linear schedule with 10% warm-up, clipping at 1.0, no dropout) is the same,
with the rate scaled linearly by the world size as `drove train ner` does.
"""

import time

T_LAUNCH = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from transformers import AutoModelForTokenClassification, AutoTokenizer, get_linear_schedule_with_warmup  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_ner import LABELS, collate, encode, read_conll  # noqa: E402

T_IMPORTED = time.time()


def say(rank, msg):
    print(f"{time.time():.3f} rank {rank}: {msg}", file=sys.stderr, flush=True)


def latest(ckpt_dir):
    """The path of the latest complete checkpoint, or None."""
    try:
        with open(os.path.join(ckpt_dir, "latest"), encoding="utf-8") as f:
            return os.path.join(ckpt_dir, f.read().strip())
    except FileNotFoundError:
        return None


def save(ckpt_dir, step, model, optim, sched):
    """Rank 0 writes step-N.pt, then points `latest` at it (both renamed into place)."""
    name = f"step-{step}.pt"
    tmp = os.path.join(ckpt_dir, name + ".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optim": optim.state_dict(),
                "sched": sched.state_dict()}, tmp)
    os.replace(tmp, os.path.join(ckpt_dir, name))
    with open(os.path.join(ckpt_dir, "latest.tmp"), "w", encoding="utf-8") as f:
        f.write(name)
    os.replace(os.path.join(ckpt_dir, "latest.tmp"), os.path.join(ckpt_dir, "latest"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="assets/conll2003")
    ap.add_argument("--model", default="assets/minilm")
    ap.add_argument("--max-train-sentences", type=int, default=160)
    ap.add_argument("--batch-size", type=int, default=2, help="per rank")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--lr", type=float, default=5e-5, help="for one rank; scaled by the world size")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--checkpoint-every", type=int, default=4, help="steps between checkpoints (0: none)")
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--fail-at-step", type=int, default=0)
    ap.add_argument("--rank-to-fail", type=int, default=-1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    os.makedirs(args.checkpoint_dir, exist_ok=True)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train = read_conll(os.path.join(args.data, "train.txt"))[: args.max_train_sentences]
    data = encode(tokenizer, train, 128)
    torch.manual_seed(args.seed)
    model = AutoModelForTokenClassification.from_pretrained(
        args.model, num_labels=len(LABELS), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)], "weight_decay": 0.01},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]
    optim = torch.optim.AdamW(groups, lr=args.lr * world)
    global_batch = args.batch_size * world
    steps_per_epoch = (len(data) + global_batch - 1) // global_batch
    total = steps_per_epoch * args.epochs
    sched = get_linear_schedule_with_warmup(optim, int(0.1 * total), total)

    step = 0
    path = latest(args.checkpoint_dir)
    if path:
        state = torch.load(path, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        step = state["step"]
    ddp = DDP(model)
    pad = tokenizer.pad_token_id
    say(rank, f"{'resumed' if path else 'started'} from step {step} (restart {restart}, world {world}; "
              f"imports {T_IMPORTED - T_LAUNCH:.1f} s, set-up {time.time() - T_IMPORTED:.1f} s)")

    ddp.train()
    while step < total:
        epoch, b = divmod(step, steps_per_epoch)
        # The epoch's order depends on (seed, epoch) only; step b takes its b-th global batch,
        # rank r its r-th slice: what a resumed run skips is exactly what was applied.
        order = list(range(len(data)))
        random.Random(args.seed * 1000 + epoch).shuffle(order)
        mine = order[b * global_batch + rank * args.batch_size : b * global_batch + (rank + 1) * args.batch_size]
        ids, mask, labels = collate([data[i] for i in mine] or [data[order[0]]], pad)
        t0 = time.perf_counter()
        loss = ddp(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        optim.step()
        sched.step()
        optim.zero_grad()
        dt = time.perf_counter() - t0
        step += 1
        if rank == 0:
            say(rank, f"step {step}/{total} world {world} loss {loss.item():.4f} {global_batch / dt:.1f} sent/s")
        if args.fail_at_step == step and args.rank_to_fail == rank and restart == 0:
            say(rank, f"killing itself with SIGKILL after step {step} (--fail-at-step)")
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0 and args.checkpoint_every and step % args.checkpoint_every == 0 and step < total:
            t = time.perf_counter()
            save(args.checkpoint_dir, step, model, optim, sched)
            say(rank, f"checkpoint at step {step} in {time.perf_counter() - t:.2f} s")
    dist.destroy_process_group()
    if rank == 0:
        say(rank, f"done at step {step}")


if __name__ == "__main__":
    main()

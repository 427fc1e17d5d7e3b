"""drove's watcher: the story's bug seen in a PyTorch program that was not changed for it.

``drove run`` puts this module into every Python rank (a ``sitecustomize`` on
``PYTHONPATH`` that imports it, then runs the program's own ``sitecustomize``);
``python -m drove.watch train.py`` does the same under torchrun, mpirun or srun.
It needs the standard library only, and watches whatever of torch, NumPy and
``random`` the program imports. Once torch's DataLoader is imported it notes:

- at each epoch (each ``iter`` over a loader) and at each loader worker's start
  (after the program's own ``worker_init_fn``), a fingerprint of every random
  stream the worker can draw from (Python's ``random``, NumPy's global state,
  torch's default generator): 8 bytes of BLAKE2b over the state, never the
  state itself;
- which of those streams the loader then draws from (the state after fetching
  a batch differs from the one at the start);
- every ``DROVE_WATCH_EVERY`` batches, a batch's MLM mask (``labels`` where
  -100 marks the unmasked tokens, HuggingFace's convention), the effect that a
  generator no fingerprint sees (a collator's own ``seed=``) still leaves.

Each note is one JSON datagram to ``DROVE_WATCH_SOCKET`` (the launcher's or,
under ``python -m drove.watch``, this rank's own collector), sent without
blocking: when the socket is full the note is dropped, never the program's
time. Whoever receives the notes compares them across ranks and workers.
"""

import hashlib
import json
import os
import socket
import sys
from array import array
from typing import Any, Callable, Dict, List, Optional

SOCKET = "DROVE_WATCH_SOCKET"
EVERY = "DROVE_WATCH_EVERY"
# The batches of each epoch (or worker) after which the watcher looks for draws:
# a loader that draws from a stream does so for its first batch.
DRAW_CHECKS = 2
# The most positions of one batch's mask sent (rows beyond are left out).
MAX_POSITIONS = 1 << 18
STREAMS = ("random", "numpy", "torch")


def _env_int(*names: str, default: int = 0) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return default


def rank() -> int:
    """This process's rank, from drove's, torchrun's, OpenMPI's or Slurm's variables."""
    return _env_int("DROVE_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def world_size() -> int:
    """The world's size, from the same launchers' variables."""
    return _env_int("DROVE_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", default=1)


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(part)
    return h.hexdigest()


def fingerprints() -> Dict[str, str]:
    """A fingerprint of each stream this process can draw from: a hash of its state, never the state."""
    out: Dict[str, str] = {}
    import random

    version, words, gauss = random.getstate()
    out["random"] = _digest(array("Q", words).tobytes(), repr((version, gauss)).encode())
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            name, keys, pos, has_gauss, cached = numpy.random.get_state(legacy=True)
            out["numpy"] = _digest(keys.tobytes(), repr((name, int(pos), int(has_gauss), float(cached))).encode())
        except Exception:  # a NumPy without the legacy global state
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            state = torch.random.default_generator.get_state()
            out["torch"] = _digest(bytes(state.numpy().tobytes()) if numpy is not None else bytes(state.tolist()))
        except Exception:  # a torch still importing, or without a default generator
            pass
    return out


class _Sender:
    """One non-blocking datagram socket a process (a forked worker gets its own)."""

    def __init__(self) -> None:
        self.pid = -1
        self.sock: Optional[socket.socket] = None
        self.dropped = 0

    def send(self, note: Dict[str, Any]) -> None:
        path = os.environ.get(SOCKET)
        if not path:
            return
        if self.pid != os.getpid():
            self.pid = os.getpid()
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.sock.setblocking(False)
            except OSError:
                self.sock = None
        if self.sock is None:
            return
        note["rank"] = rank()
        try:
            self.sock.sendto(json.dumps(note, separators=(",", ":")).encode(), path)
        except OSError:
            self.dropped += 1


_sender = _Sender()
send = _sender.send


class _Worker:
    """What this loader worker noted at its start (set in the worker process only)."""

    def __init__(self, loader: int, epoch: int, worker: int) -> None:
        self.loader, self.epoch, self.worker = loader, epoch, worker
        self.start = fingerprints()
        self.drawn: List[str] = []
        self.batches = 0
        send({"t": "streams", "loader": loader, "epoch": epoch, "worker": worker, "fp": self.start})

    def after_batch(self) -> None:
        if self.batches >= DRAW_CHECKS:
            return
        self.batches += 1
        now = fingerprints()
        new = [s for s in STREAMS if s in now and now[s] != self.start.get(s) and s not in self.drawn]
        if new:
            self.drawn.extend(new)
            send({"t": "drawn", "loader": self.loader, "epoch": self.epoch, "worker": self.worker, "streams": new})


_worker: Optional[_Worker] = None


class WorkerStart:
    """A loader's ``worker_init_fn``: the program's own first, then the worker's fingerprints."""

    def __init__(self, inner: Any, loader: int, epoch: int) -> None:
        self.inner, self.loader, self.epoch = inner, loader, epoch

    def __call__(self, worker_id: int) -> None:
        global _worker
        if self.inner is not None:
            self.inner(worker_id)
        _worker = _Worker(self.loader, self.epoch, worker_id)


class Collate:
    """A loader's ``collate_fn``: the program's own, then (in a worker) whether the batch drew from a stream."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, batch: Any) -> Any:
        out = self.inner(batch)
        if _worker is not None:
            _worker.after_batch()
        return out


def _mask_note(batch: Any) -> Optional[Dict[str, Any]]:
    """The batch's MLM mask as a note, or None when the batch carries none.

    A batch is a mapping with ``labels`` and ``input_ids`` of one 2-D shape; the
    chosen positions are ``labels != -100``. Token classification labels look
    alike, so a batch counts as masked only when most chosen positions hold one
    input id (the mask token, which replaces 80% of them). The compared
    positions are those attended (``attention_mask``), less each row's first and
    last: a special token there is never chosen on any rank, which would read
    as agreement.
    """
    try:
        labels, ids = batch["labels"], batch["input_ids"]
    except (TypeError, KeyError, IndexError):
        return None
    if not hasattr(labels, "dim") or labels.dim() != 2 or tuple(ids.shape) != tuple(labels.shape):
        return None
    chosen = labels != -100
    picked = ids[chosen]
    if picked.numel() == 0 or picked.numel() * 2 > chosen.numel():
        return None
    if int(picked.bincount().max()) * 5 < picked.numel() * 2:
        return None
    attended = batch.get("attention_mask") if hasattr(batch, "get") else None
    if attended is not None and tuple(attended.shape) == tuple(labels.shape):
        can = (attended != 0).clone()
    else:
        can = chosen.new_ones(chosen.shape)
    lengths = can.sum(dim=1).tolist()
    firsts = can.long().argmax(dim=1).tolist()
    for r, (first, length) in enumerate(zip(firsts, lengths)):
        if length > 0:
            can[r, first] = False
            can[r, first + length - 1] = False
    rows, width = int(labels.shape[0]), int(labels.shape[1])
    rows = max(1, min(rows, MAX_POSITIONS // max(width, 1)))
    return {
        "rows": rows,
        "width": width,
        "chosen": _bits(chosen[:rows]),
        "maskable": _bits(can[:rows]),
    }


def _bits(flags: Any) -> str:
    """Row-major flags packed 8 to a byte, most significant bit first, in hex."""
    flags = flags.detach().cpu().reshape(-1)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        return numpy.packbits(flags.numpy()).tobytes().hex()
    flat = flags.tolist()
    packed = bytearray((len(flat) + 7) // 8)
    for i, v in enumerate(flat):
        if v:
            packed[i >> 3] |= 0x80 >> (i & 7)
    return bytes(packed).hex()


class _Loaders:
    """The loaders of this process, numbered in the order they are first iterated."""

    def __init__(self) -> None:
        self.count = 0
        self.every = max(1, _env_int(EVERY, default=10))


_loaders = _Loaders()

# Called at the start of every loader epoch with (loader, epoch), before its
# workers start: `python -m drove.watch` compares the ranks' notes there.
on_epoch: Optional[Callable[[int, int], None]] = None


def _start_epoch(loader: Any) -> Dict[str, int]:
    state = getattr(loader, "_drove_watch", None)
    if state is None:
        state = {"loader": _loaders.count, "epoch": -1}
        _loaders.count += 1
        object.__setattr__(loader, "_drove_watch", state)
    state["epoch"] += 1
    return state


def patch(module: Any) -> None:
    """Watches ``module.DataLoader`` (torch.utils.data.dataloader) and its iterators."""
    loader_class = module.DataLoader
    if getattr(loader_class, "_drove_watched", False):
        return
    original_iter = loader_class.__iter__
    original_next = module._BaseDataLoaderIter.__next__

    def __iter__(self: Any) -> Any:
        state = _start_epoch(self)
        if on_epoch is not None:
            on_epoch(state["loader"], state["epoch"])
        workers = getattr(self, "num_workers", 0)
        main = workers == 0
        inner_init, inner_collate = self.worker_init_fn, self.collate_fn
        if not main:
            object.__setattr__(self, "worker_init_fn", WorkerStart(inner_init, state["loader"], state["epoch"]))
            object.__setattr__(self, "collate_fn", Collate(inner_collate))
        else:
            send({"t": "streams", "loader": state["loader"], "epoch": state["epoch"], "worker": -1, "fp": fingerprints()})
        try:
            it = original_iter(self)
        finally:
            if not main:
                object.__setattr__(self, "worker_init_fn", inner_init)
                object.__setattr__(self, "collate_fn", inner_collate)
        it._drove_watch = {"loader": state["loader"], "epoch": state["epoch"], "batch": 0, "main": main, "drawn": []}
        return it

    def __next__(self: Any) -> Any:
        seen = getattr(self, "_drove_watch", None)
        if seen is None:
            return original_next(self)
        check = seen["main"] and seen["batch"] < DRAW_CHECKS
        before = fingerprints() if check else None
        batch = original_next(self)
        if before is not None:
            after = fingerprints()
            new = [s for s in STREAMS if s in after and after[s] != before.get(s) and s not in seen["drawn"]]
            if new:
                seen["drawn"].extend(new)
                send({"t": "drawn", "loader": seen["loader"], "epoch": seen["epoch"], "worker": -1, "streams": new})
        if seen["batch"] % _loaders.every == 0:
            note = _mask_note(batch)
            if note is not None:
                note.update(t="mask", loader=seen["loader"], epoch=seen["epoch"], batch=seen["batch"])
                send(note)
        seen["batch"] += 1
        return batch

    loader_class.__iter__ = __iter__
    module._BaseDataLoaderIter.__next__ = __next__
    loader_class._drove_watched = True


class _AfterImport:
    """Calls ``then(module)`` as soon as the module ``name`` has run, whenever the program imports it."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module: Any) -> None:
            run(module)
            then(module)

        spec.loader.exec_module = exec_module
        return spec


def on_import(name: str, then: Callable[[Any], None]) -> None:
    """Calls ``then(module)`` once the module ``name`` is imported: now if it is."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, then))


_said = False


def cannot_watch(why: str) -> None:
    """Says once, on rank 0, why this program cannot be watched."""
    global _said
    if _said or rank() != 0:
        return
    _said = True
    print("drove-watch: cannot watch this program: %s" % why, file=sys.stderr, flush=True)


def _patch_or_say(module: Any) -> None:
    try:
        patch(module)
    except Exception as e:  # a torch whose DataLoader has another shape
        cannot_watch("torch %s's DataLoader: %s" % (getattr(sys.modules.get("torch"), "__version__", "?"), e))


def install() -> None:
    """Watches the DataLoader now if torch is imported, else as soon as it is."""
    on_import("torch.utils.data.dataloader", _patch_or_say)

"""drove for PyTorch: worker seeding, drove's sampler and per-sample masking,
and the diversity diagnostic over ``torch.distributed``.

The story's bug, in three lines every rank runs::

    random.seed(42); np.random.seed(42); torch.manual_seed(42)
    loader = DataLoader(dataset, num_workers=4, collate_fn=mask_15_percent)

PyTorch seeds worker ``w``'s ``random`` with ``base_seed + w``, and
``base_seed`` comes from the main process's generator: the same on every
rank, so every rank draws the same masks. The fix is one argument::

    loader = DataLoader(dataset, num_workers=4, collate_fn=mask_15_percent,
                        worker_init_fn=drove.torch.worker_init_fn(42))

and the diagnostic shows which of the two a run is::

    report = drove.torch.mask_agreement(mask, maskable, probability=0.15)
    report.verdict   # "identical" under the bug, "diverse" with the fix

Importing this module imports torch; ``import drove`` does not.
"""

import random
from typing import Any, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data

from . import _diagnostic
from ._diagnostic import GradCosine, MaskShapeError
from ._drove import AgreementReport, Masker, Sampler, StreamKey

__all__ = [
    "DistributedSampler",
    "GradCosine",
    "MaskShapeError",
    "MaskedDataset",
    "WorkerSeeder",
    "grad_cosine",
    "mask_agreement",
    "seed_process",
    "worker_init_fn",
    "worker_key",
]

_U64 = 1 << 64


def _distributed(group: Any = None) -> bool:
    return dist.is_available() and dist.is_initialized() and (group is None or group is not dist.GroupMember.NON_GROUP_MEMBER)


def _rank(rank: Optional[int], group: Any = None) -> int:
    if rank is not None:
        if rank < 0:
            raise ValueError("rank must be >= 0, got %d" % rank)
        return int(rank)
    return dist.get_rank(group) if _distributed(group) else 0


def seed_process(key: StreamKey) -> None:
    """Seeds Python's ``random``, NumPy's global state and torch from one stream key.

    Each library gets its own draws of the key's stream, so no two of them
    share a state.
    """
    out = key.outputs(5)
    random.seed(out[0] | (out[1] << 64))
    np.random.seed([word for o in out[2:4] for word in (o & 0xFFFFFFFF, o >> 32)])
    torch.manual_seed(out[4])


_worker_key: Optional[StreamKey] = None


def worker_key() -> Optional[StreamKey]:
    """The key this loader worker was seeded from (log its ``derived_seed()`` to replay it); ``None`` elsewhere."""
    return _worker_key


class WorkerSeeder:
    """A ``DataLoader(worker_init_fn=...)`` that seeds each worker from a whole key.

    The key holds the base seed, the rank, the worker id and the loader's
    per-epoch seed (``get_worker_info().seed - id``, which PyTorch draws anew
    for each epoch's iterator from the main process's generator, so
    ``torch.manual_seed`` makes it repeat run to run): streams differ across
    ranks, workers and epochs. Picklable, so it works with ``fork`` and
    ``spawn``; with ``persistent_workers`` each worker is seeded once and its
    streams run on across epochs.
    """

    def __init__(self, seed: int, rank: int) -> None:
        if not 0 <= seed < _U64:
            raise ValueError("seed must be in [0, 2**64), got %d" % seed)
        self.seed = int(seed)
        self.rank = int(rank)

    def key(self, worker: int, loader_seed: int = 0) -> StreamKey:
        """The key of ``worker`` under the loader's per-epoch seed ``loader_seed``."""
        return StreamKey.augment(seed=self.seed, rank=self.rank, worker=worker, epoch=loader_seed % _U64)

    def __call__(self, worker_id: int) -> None:
        global _worker_key
        info = torch.utils.data.get_worker_info()
        loader_seed = (info.seed - info.id) if info is not None else 0
        _worker_key = self.key(worker_id, loader_seed)
        seed_process(_worker_key)

    def __repr__(self) -> str:
        return "WorkerSeeder(seed=%d, rank=%d)" % (self.seed, self.rank)


def worker_init_fn(seed: int, rank: Optional[int] = None, group: Any = None) -> WorkerSeeder:
    """The ``worker_init_fn`` for this rank: ``rank`` if given, else torch.distributed's.

    Call it after ``init_process_group`` (the rank is taken then, so spawned
    workers, which have no process group, get it too).
    """
    return WorkerSeeder(seed, _rank(rank, group))


class DistributedSampler(torch.utils.data.Sampler):
    """``torch.utils.data.DistributedSampler`` with drove-collate's order.

    The epoch's order comes from drove-seed's shuffle stream of (seed,
    epoch), the same on every rank and in drove's Rust trainer; shards are
    strided and padded by repeating the order's start (or truncated with
    ``drop_last``). Call ``set_epoch`` before each epoch.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if num_replicas is None:
            num_replicas = dist.get_world_size() if _distributed() else 1
        self.num_replicas = int(num_replicas)
        self.rank = _rank(rank)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.dataset_len = len(dataset)
        self._sampler()  # checks the arguments now, not at the first epoch

    def _sampler(self) -> Sampler:
        sampler = Sampler(
            self.dataset_len,
            world_size=self.num_replicas,
            rank=self.rank,
            seed=self.seed,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )
        sampler.set_epoch(self.epoch)
        return sampler

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch: the order changes with it, identically on every rank."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(self._sampler().indices().tolist())

    def __len__(self) -> int:
        return len(self._sampler())


class MaskedDataset(torch.utils.data.Dataset):
    """A dataset whose samples are masked, each from its own stream.

    Sample ``i`` of epoch ``e`` is masked from drove-seed's per-sample stream
    of (``seed``, ``e``, ``i``), so its mask depends on neither the worker
    that loads it nor the number of ranks: a resized world masks every sample
    as before. Each sample is a mapping holding token ids under ``ids``;
    positions are maskable where ``sample[maskable]`` is true when
    ``maskable`` names a key, else where the id is not one of
    ``special_tokens``. The sample comes back with the masked ids and a
    boolean ``"mask"`` (the positions chosen).
    """

    def __init__(
        self,
        dataset: Any,
        masker: Masker,
        *,
        seed: int,
        ids: str = "input_ids",
        maskable: Optional[str] = None,
        special_tokens: Sequence[int] = (),
        epoch: int = 0,
    ) -> None:
        self.dataset = dataset
        self.masker = masker
        self.seed = int(seed)
        self.ids = ids
        self.maskable = maskable
        self.special_tokens = np.asarray(list(special_tokens), np.int64)
        self.epoch = int(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Masks of another epoch (with persistent workers, make the loader anew after it)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Mapping[str, Any]:
        sample = self.dataset[index]
        ids = np.asarray(sample[self.ids], np.int64)
        if self.maskable is not None:
            can = np.asarray(sample[self.maskable], np.bool_)
        else:
            can = ~np.isin(ids, self.special_tokens)
        masked, actions = self.masker.mask(
            ids[None, :], can[None, :], seed=self.seed, epoch=self.epoch, samples=np.array([index], np.int64)
        )
        out = dict(sample)
        out[self.ids] = torch.from_numpy(masked[0])
        out["mask"] = torch.from_numpy(actions[0] != 0)
        return out


def _gather(group: Any) -> _diagnostic.Gather:
    """``all_gather`` of one NumPy array from every rank, stacked; on the device NCCL needs."""
    world = dist.get_world_size(group)
    on_cuda = dist.get_backend(group) == "nccl"

    def gather(array: np.ndarray) -> np.ndarray:
        local = torch.from_numpy(np.ascontiguousarray(array))
        if on_cuda:
            local = local.cuda()
        every = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(every, local, group=group)
        return torch.stack(every).cpu().numpy()

    return gather


def _alone(array: np.ndarray) -> np.ndarray:
    return array[None, ...]


def _world(group: Any) -> Tuple[_diagnostic.Gather, int, int]:
    """(gather, rank, world size) of ``group``, or of a world of one without a process group."""
    if _distributed(group):
        return _gather(group), dist.get_rank(group), dist.get_world_size(group)
    return _alone, 0, 1


def mask_agreement(
    mask: Any,
    maskable: Any = None,
    *,
    probability: float = 0.15,
    step: Optional[int] = None,
    group: Any = None,
    metrics: Any = None,
) -> Optional[AgreementReport]:
    """How often the ranks' masks agree, against independent masks.

    ``mask`` is this rank's boolean mask of *its own* batch (rows x
    positions; a tensor or an array), ``maskable`` where a position could be
    masked (default: everywhere). Every rank of ``group`` calls it at the
    same step; the ranks first agree on the shape (a rank whose shape or
    input differs makes every rank raise ``MaskShapeError`` naming it), then
    compare position by position where maskable on both. Returns the report
    (``mean_agreement``, ``expected``, ``sigma``, ``normalised``,
    ``verdict``, ``alarm``), or ``None`` for a world of one. Under ``drove
    run`` (or any launch with ``DROVE_COORDINATOR``) it is recorded as
    ``mask_agreement``, ``mask_agreement_expected``,
    ``mask_agreement_sigma`` and, on the alarm, ``diversity_alarm`` (point
    and event); ``metrics=False`` records nothing, a ``drove.Metrics``
    records there. ``step`` defaults to the number of earlier calls.
    """
    return _diagnostic.mask_agreement(*_world(group), mask, maskable, probability, step, metrics)


def grad_cosine(
    parameter: Any,
    *,
    step: Optional[int] = None,
    group: Any = None,
    metrics: Any = None,
) -> GradCosine:
    """Cosine similarity between the ranks' local gradients of ``parameter``.

    Call it after ``backward()`` and before the gradients are averaged (with
    DDP: inside ``no_sync()``, or on a gradient you computed). ``parameter``
    is a ``Parameter`` (its ``.grad`` is used) or a tensor. Recorded as
    ``grad_cosine`` like ``mask_agreement``.
    """
    grad = parameter.grad if isinstance(parameter, torch.nn.Parameter) else parameter
    return _diagnostic.grad_cosine(*_world(group), grad, step, metrics)

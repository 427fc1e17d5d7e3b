"""Ranks as threads for the diagnostic's tests: a real all-gather (every
rank's array, stacked) through a barrier, and a Horovod stand-in on it."""

import threading
from typing import Any, Callable, List

import numpy as np


class ThreadWorld:
    """``size`` ranks as threads meeting at a barrier (with a deadline: a
    rank that never comes breaks it, never a hang)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: List[Any] = [None] * size
        self.barrier = threading.Barrier(size, timeout=60)

    def gather(self, rank: int) -> Callable[[np.ndarray], np.ndarray]:
        def gather(array: np.ndarray) -> np.ndarray:
            self.slots[rank] = np.array(array, copy=True)
            self.barrier.wait()
            out = np.stack(self.slots)
            self.barrier.wait()
            return out

        return gather

    def run(self, body: Callable[[int], Any]) -> List[Any]:
        """Runs ``body(rank)`` on every rank; returns each rank's result or exception."""
        results: List[Any] = [None] * self.size

        def one(rank: int) -> None:
            try:
                results[rank] = body(rank)
            except BaseException as e:  # noqa: BLE001 (the test inspects it)
                results[rank] = e

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return results


class HorovodStandIn:
    """What ``horovod.torch`` offers the diagnostic: ``rank``, ``size`` and
    ``allgather`` (every rank's tensor concatenated on the first axis)."""

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self.world, self._rank = world, rank
        self._gather = world.gather(rank)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self.world.size

    def allgather(self, tensor: Any) -> Any:
        import torch

        every = self._gather(tensor.numpy())
        return torch.from_numpy(every.reshape((-1,) + tuple(tensor.shape[1:])))

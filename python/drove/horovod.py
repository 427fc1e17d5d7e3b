"""drove for Horovod: the diversity diagnostic over ``hvd.allgather``.

The same reports as ``drove.torch`` for the same masks; only the gathering
differs. ``hvd`` defaults to ``horovod.torch`` (imported when first needed);
pass any module with ``rank()``, ``size()`` and ``allgather(tensor)`` (which
concatenates every rank's tensor on the first axis), e.g. ``horovod.tensorflow``.
Worker seeding is ``drove.torch.worker_init_fn(seed, rank=hvd.rank())``.
"""

from typing import Any, Optional

import numpy as np

from . import _diagnostic
from ._diagnostic import GradCosine, MaskShapeError
from ._drove import AgreementReport

__all__ = ["GradCosine", "MaskShapeError", "grad_cosine", "mask_agreement"]


def _hvd(hvd: Any) -> Any:
    if hvd is not None:
        return hvd
    import horovod.torch  # noqa: PLC0415 (lazy: Horovod is optional)

    return horovod.torch


def _gather(hvd: Any) -> _diagnostic.Gather:
    import torch  # noqa: PLC0415 (lazy: horovod.torch gathers torch tensors)

    world = hvd.size()

    def gather(array: np.ndarray) -> np.ndarray:
        local = torch.from_numpy(np.ascontiguousarray(array))[None, ...]
        every = hvd.allgather(local)
        return every.cpu().numpy().reshape((world,) + array.shape)

    return gather


def mask_agreement(
    mask: Any,
    maskable: Any = None,
    *,
    probability: float = 0.15,
    step: Optional[int] = None,
    hvd: Any = None,
    metrics: Any = None,
) -> Optional[AgreementReport]:
    """``drove.torch.mask_agreement`` over Horovod's ``allgather``."""
    hvd = _hvd(hvd)
    return _diagnostic.mask_agreement(
        _gather(hvd), hvd.rank(), hvd.size(), mask, maskable, probability, step, metrics
    )


def grad_cosine(parameter: Any, *, step: Optional[int] = None, hvd: Any = None, metrics: Any = None) -> GradCosine:
    """``drove.torch.grad_cosine`` over Horovod's ``allgather``."""
    import torch  # noqa: PLC0415

    hvd = _hvd(hvd)
    grad = parameter.grad if isinstance(parameter, torch.nn.Parameter) else parameter
    return _diagnostic.grad_cosine(_gather(hvd), hvd.rank(), hvd.size(), grad, step, metrics)

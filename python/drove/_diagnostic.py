"""The diagnostic's framework-free core: what every rank contributes, how
the ranks first agree on it, and what is recorded.

``drove.torch`` and ``drove.horovod`` differ only in how they gather one
NumPy array from every rank (``gather(array) -> array stacked on a new first
axis``); everything else is here, so both give the same report for the same
masks. Every rank gathers a small header first (a status word, then the
mask's shape), so a rank with an unusable mask or a different shape makes
*every* rank raise the same ``MaskShapeError`` naming it, never a hang.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _recorder
from ._drove import AgreementReport, agreement, metric_names
from ._drove import grad_cosine as _grad_cosine

Gather = Callable[[np.ndarray], np.ndarray]

# A rank's status word in the header: what was wrong with its own input.
_OK, _NOT_2D, _MASKABLE_SHAPE, _NOT_BOOL, _PROBABILITY, _NOT_NUMBERS, _NO_GRAD = range(7)
_PROBLEMS = {
    _NOT_2D: "a mask that is not 1-D or 2-D (rows x positions)",
    _MASKABLE_SHAPE: "a maskable whose shape differs from its mask's",
    _NOT_BOOL: "a mask or maskable that is not boolean (or 0/1)",
    _PROBABILITY: "a probability outside [0, 1]",
    _NOT_NUMBERS: "a gradient that could not be read as numbers",
    _NO_GRAD: "a parameter with no gradient yet (call backward() first)",
}


class MaskShapeError(ValueError):
    """The ranks' inputs to a diagnostic do not fit together: raised on every rank."""


_calls: Dict[str, int] = {}


def _step(what: str, step: Optional[int]) -> int:
    """The step a diagnostic is recorded at: the caller's, else how many calls came before."""
    count = _calls.get(what, 0)
    _calls[what] = count + 1
    return count if step is None else int(step)

Recorder = Any  # drove.Metrics, None, or False (do not record)


def _as_flags(value: Any) -> np.ndarray:
    """A mask as a NumPy bool array, from NumPy or anything with ``.numpy()`` (a torch tensor)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype != np.bool_:
        if array.dtype.kind not in "biu" or not np.isin(array, (0, 1)).all():
            raise TypeError
        array = array.astype(np.bool_)
    return array


def _local_masks(mask: Any, maskable: Any, probability: float) -> Tuple[int, np.ndarray, np.ndarray]:
    """This rank's (status, chosen, maskable); on a bad status the arrays are empty."""
    empty = np.zeros((0, 0), np.bool_)
    if not isinstance(probability, (int, float)) or not 0.0 <= probability <= 1.0:
        return _PROBABILITY, empty, empty
    try:
        chosen = _as_flags(mask)
        can = np.ones_like(chosen) if maskable is None else _as_flags(maskable)
    except (TypeError, ValueError):
        return _NOT_BOOL, empty, empty
    if chosen.ndim == 1:
        chosen = chosen[None, :]
        can = can[None, :] if can.ndim == 1 else can
    if chosen.ndim != 2:
        return _NOT_2D, empty, empty
    if can.shape != chosen.shape:
        return _MASKABLE_SHAPE, empty, empty
    return _OK, chosen, can


def _check_headers(what: str, headers: np.ndarray, shape_names: Sequence[str]) -> None:
    """Raises on every rank when any rank's input was unusable or the shapes differ."""
    bad: Dict[int, List[int]] = {}
    for rank, status in enumerate(headers[:, 0].tolist()):
        if status != _OK:
            bad.setdefault(status, []).append(rank)
    if bad:
        parts = ["rank(s) %s passed %s" % (ranks, _PROBLEMS[status]) for status, ranks in sorted(bad.items())]
        raise MaskShapeError("%s: %s" % (what, "; ".join(parts)))
    by_shape: Dict[Tuple[int, ...], List[int]] = {}
    for rank, row in enumerate(headers[:, 1:].tolist()):
        by_shape.setdefault(tuple(row), []).append(rank)
    if len(by_shape) > 1:
        parts = [
            "rank(s) %s have %s" % (ranks, " x ".join("%d %s" % (n, name) for n, name in zip(shape, shape_names)))
            for shape, ranks in sorted(by_shape.items(), key=lambda item: item[1][0])
        ]
        raise MaskShapeError(
            "%s: the ranks' shapes differ (every rank must pass the same shape): %s" % (what, "; ".join(parts))
        )


def _metrics(metrics: Recorder) -> Any:
    if metrics is False:
        return None
    return _recorder.recorder() if metrics is None else metrics


def mask_agreement(
    gather: Gather,
    rank: int,
    world_size: int,
    mask: Any,
    maskable: Any = None,
    probability: float = 0.15,
    step: Optional[int] = None,
    metrics: Recorder = None,
) -> Optional[AgreementReport]:
    """Compares every rank's mask of its own batch; see ``drove.torch.mask_agreement``."""
    step = _step("mask_agreement", step)
    status, chosen, can = _local_masks(mask, maskable, probability)
    header = np.array([status, chosen.shape[0], chosen.shape[1]], np.int64)
    _check_headers("mask_agreement", gather(header), ("rows", "positions"))
    if world_size < 2:
        return None
    packed = chosen.astype(np.uint8) | (can.astype(np.uint8) << 1)
    every = gather(packed)
    report = agreement((every & 1) != 0, (every & 2) != 0, probability=float(probability))
    _record_agreement(_metrics(metrics), rank, step, report)
    return report


def _record_agreement(metrics: Any, rank: int, step: int, report: AgreementReport) -> None:
    """The points `drove train ner` records, under drove-proto's names (and the world's size, which
    Prometheus shows: ranks that torch.distributed formed never join the coordinator's rendezvous);
    the alarm's event from rank 0."""
    if metrics is None:
        return
    names = metric_names
    metrics.record(step, names["MASK_AGREEMENT"], report.mean_agreement)
    metrics.record(step, names["MASK_AGREEMENT_EXPECTED"], report.expected)
    metrics.record(step, names["MASK_AGREEMENT_SIGMA"], report.sigma)
    metrics.record(step, names["WORLD_SIZE"], report.world_size)
    if report.alarm:
        metrics.record(step, names["DIVERSITY_ALARM"], 1.0)
        if rank == 0:
            metrics.event(step, names["EVENT_DIVERSITY_ALARM"], report.explain())


class GradCosine:
    """Cosine similarity between the ranks' local gradients of one parameter."""

    def __init__(self, matrix: List[List[float]], mean: float) -> None:
        self.matrix: List[List[float]] = matrix
        self.mean: float = mean
        self.world_size: int = len(matrix)

    def to_dict(self) -> Dict[str, Union[float, int, List[List[float]]]]:
        return {"mean": self.mean, "world_size": self.world_size, "matrix": self.matrix}

    def __repr__(self) -> str:
        return "GradCosine(world_size=%d, mean=%.4f)" % (self.world_size, self.mean)


def grad_cosine(
    gather: Gather,
    rank: int,
    world_size: int,
    grad: Any,
    step: Optional[int] = None,
    metrics: Recorder = None,
) -> GradCosine:
    """Cosine similarity of every pair of ranks' local gradients; see ``drove.torch.grad_cosine``."""
    step = _step("grad_cosine", step)
    local, status = np.zeros(0, np.float64), _NO_GRAD
    if grad is not None:
        try:
            if hasattr(grad, "detach"):
                grad = grad.detach().cpu().double().numpy()
            local, status = np.asarray(grad, np.float64).ravel(), _OK
        except (TypeError, ValueError):
            status = _NOT_NUMBERS
    _check_headers("grad_cosine", gather(np.array([status, local.size], np.int64)), ("values",))
    every = gather(local)
    # drove-diagnostic's cosine, the one the Rust trainer records.
    result = GradCosine(*_grad_cosine(np.ascontiguousarray(every, np.float64)))
    recorder = _metrics(metrics)
    if recorder is not None and world_size > 1:
        recorder.record(step, metric_names["GRAD_COSINE"], result.mean)
    return result

"""drove for Python: every rank and loader worker on its own derived random stream.

``StreamKey`` names one stream (purpose, base seed, rank, loader worker,
epoch, lane) and hashes it exactly as drove's Rust crates and ``drove seed``
do, so the same key draws the same numbers in Python and in Rust::

    >>> from drove import StreamKey
    >>> key = StreamKey.augment(seed=42, rank=1, worker=2, epoch=3)
    >>> key.derived_seed()      # the 64 hex digits `drove seed --json` prints
    >>> key.numpy().bit_generator.random_raw(4)   # `drove seed`'s outputs

``replay_outputs(derived_seed)`` replays a stream from a logged derived seed.
``SampleStreams(seed=42, purpose="augment", epoch=3).outputs(sample)`` is a
sample's own stream (the masker's), whatever worker or rank draws it.

``Masker`` is drove-collate's masker over NumPy arrays: each row masked from
its sample's own stream, the same masks bit for bit as the Rust masker::

    >>> from drove import Masker
    >>> masker = Masker(mask_token=103, vocab_size=30522, probability=0.15)
    >>> masked, actions = masker.mask(ids, maskable, seed=42, epoch=0, samples=indices)


The framework modules import their framework when imported, never here:
``drove.torch`` (``worker_init_fn``, ``DistributedSampler``,
``MaskedDataset``, ``mask_agreement``, ``grad_cosine``) and
``drove.horovod`` (the diagnostic over ``hvd.allgather``).

``Metrics`` is drove-metrics' recorder (buffered, delivered at least once, a
bounded flush at exit); ``recorder()`` is the one ``drove run`` gives this
process, or ``None`` without a coordinator::

    >>> metrics = drove.recorder()
    >>> if metrics: metrics.record(step, "loss", loss)

``progress(step, total, loss=...)`` feeds ``drove run``'s bar from rank 0.
"""

from ._drove import (
    AgreementReport,
    Masker,
    Metrics,
    Sampler,
    SampleStreams,
    StreamKey,
    agreement,
    expected_agreement,
    metric_names,
    progress,
    replay_outputs,
    replay_sample_outputs,
)
from ._recorder import recorder

__all__ = [
    "AgreementReport",
    "Masker",
    "Metrics",
    "SampleStreams",
    "Sampler",
    "StreamKey",
    "agreement",
    "expected_agreement",
    "metric_names",
    "progress",
    "recorder",
    "replay_outputs",
    "replay_sample_outputs",
]

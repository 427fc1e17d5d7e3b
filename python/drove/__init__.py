"""drove for Python: every rank and loader worker on its own derived random stream.

``StreamKey`` names one stream (purpose, base seed, rank, loader worker,
epoch, lane) and hashes it exactly as drove's Rust crates and ``drove seed``
do, so the same key draws the same numbers in Python and in Rust::

    >>> from drove import StreamKey
    >>> key = StreamKey.augment(seed=42, rank=1, worker=2, epoch=3)
    >>> key.derived_seed()      # the 64 hex digits `drove seed --json` prints
    >>> key.numpy().bit_generator.random_raw(4)   # `drove seed`'s outputs

``replay_outputs(derived_seed)`` replays a stream from a logged derived seed.

``Masker`` is drove-collate's masker over NumPy arrays: each row masked from
its sample's own stream, the same masks bit for bit as the Rust masker::

    >>> from drove import Masker
    >>> masker = Masker(mask_token=103, vocab_size=30522, probability=0.15)
    >>> masked, actions = masker.mask(ids, maskable, seed=42, epoch=0, samples=indices)
"""

from ._drove import Masker, StreamKey, replay_outputs

__all__ = ["Masker", "StreamKey", "replay_outputs"]

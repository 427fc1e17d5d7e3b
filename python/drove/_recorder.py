"""The process's metrics recorder from the launch environment.

``recorder()`` is the ``drove.Metrics`` that ``drove run`` (or any launch
with ``DROVE_COORDINATOR``) gives this process, made once per process and
closed at exit with a bounded flush; ``None`` when no coordinator was given.
A forked child (a DataLoader worker) gets its own, never its parent's: a
recorder's delivery thread does not survive ``fork``.
"""

import atexit
import os
import sys
from typing import Dict, Optional

from ._drove import Metrics

_recorders: Dict[int, Optional[Metrics]] = {}


def recorder(rank: Optional[int] = None) -> Optional[Metrics]:
    """This process's recorder (``Metrics.from_env``), or ``None`` without a coordinator."""
    pid = os.getpid()
    if pid not in _recorders:
        made = Metrics.from_env(rank)
        _recorders[pid] = made
        if made is not None:
            atexit.register(_close, pid)
    return _recorders[pid]


def _close(pid: int) -> None:
    made = _recorders.get(pid)
    if made is None or pid != os.getpid() or made.closed:
        return
    delivery = made.close()
    if delivery is not None and delivery["undelivered"]:
        print("drove: warning: " + delivery["summary"], file=sys.stderr)

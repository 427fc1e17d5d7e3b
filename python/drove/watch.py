"""``python -m drove.watch train.py [args]``: drove's watcher without ``drove run``.

Under torchrun, mpirun or srun (or plain ``python``), this puts the watcher
that ``drove run`` carries into this rank and every loader worker it starts,
then runs the program unchanged (``python -m drove.watch -m package.module``
runs a module). The ranks compare what they saw through the program's own
process group (``torch.distributed``, once the program initialises it): at
the start of each epoch of its first loader and before the group is
destroyed. Rank 0 prints the alarm, its fix and, at the end, a summary, in
``drove run``'s words, and records the alarm where ``drove.recorder()``
records. Without a process group, rank 0 compares its own workers only and
says that it could not compare across ranks.
"""

import atexit
import os
import runpy
import shutil
import socket
import sys
import tempfile
import threading
from typing import Any, List, Optional

from ._drove import WATCHER_SOURCE, NoteComparer

PREFIX = "drove-watch: "


class Collector:
    """This rank's notes: a datagram socket its watcher and loader workers send to."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="drove-watch-")
        self.path = os.path.join(self.dir, "notes.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        atexit.register(shutil.rmtree, self.dir, True)
        self.sock.settimeout(0.05)
        self.notes: List[bytes] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._receive, name="drove-watch", daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        while not self.stopped:
            try:
                data = self.sock.recv(1 << 20)
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.notes.append(data)

    def take(self) -> List[bytes]:
        """The notes since the last take."""
        with self.lock:
            taken, self.notes = self.notes, []
        return taken


class Watch:
    """One rank's watch: the collector, the comparison (rank 0), the exchanges."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.rank = core.rank()
        self.collector = Collector()
        self.comparer: Optional[NoteComparer] = None
        self.group: Any = None
        self.compared_across = False
        self.finished = False

    def _dist(self) -> Any:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return dist

    def exchange(self, *_: Any) -> None:
        """Every rank's notes so far to rank 0, through the program's process group."""
        notes = self.collector.take()
        dist = self._dist()
        if dist is None or dist.get_world_size() < 2:
            everyone = [notes]
            world = 1
        else:
            world = dist.get_world_size()
            if self.group is None:
                import datetime

                # A rank that never comes (it failed) ends the wait, not the job.
                self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=120))
            everyone = [None] * world if dist.get_rank() == 0 else None
            dist.gather_object(notes, everyone, dst=0, group=self.group)
            self.compared_across = True
        if self.rank != 0:
            return
        if self.comparer is None:
            self.comparer = NoteComparer(world)
        for rank_notes in everyone:
            for note in rank_notes or []:
                try:
                    alarms = self.comparer.add(note)
                except ValueError:
                    continue
                for alarm in alarms:
                    self.say("diversity alarm: " + alarm)
                    self.record(alarm)

    def say(self, text: str) -> None:
        print(PREFIX + text, file=sys.stderr, flush=True)

    def record(self, alarm: str) -> None:
        try:
            from . import _recorder
            from ._drove import metric_names

            metrics = _recorder.recorder()
            if metrics is not None:
                metrics.record(0, metric_names["DIVERSITY_ALARM"], 1.0)
                metrics.event(0, metric_names["EVENT_DIVERSITY_ALARM"], alarm)
        except Exception as e:  # the alarm is said; a point it could not record is not the program's end
            self.say("the alarm was not recorded: %s" % e)

    def finish(self) -> None:
        """The last exchange (while the group is still there), then rank 0's summary."""
        if self.finished:
            return
        self.finished = True
        self.exchange()
        if self.rank != 0 or self.comparer is None:
            return
        summary, alarms, warnings = self.comparer.finish()
        self.say(summary)
        for alarm in alarms:
            self.say("diversity alarm, in full: " + alarm)
        for warning in warnings:
            self.say("warning: " + warning)
        if not self.compared_across and self.core.world_size() > 1:
            self.say(
                "could not compare across ranks: the program formed no torch.distributed process group "
                "(its own workers were compared); under drove run every rank is compared"
            )


def _core() -> Any:
    """The watcher's source (the one drove run carries), importable as ``drove_watch`` here and in spawned workers."""
    folder = tempfile.mkdtemp(prefix="drove-watcher-")
    with open(os.path.join(folder, "drove_watch.py"), "w") as f:
        f.write(WATCHER_SOURCE)
    sys.path.insert(0, folder)
    atexit.register(shutil.rmtree, folder, True)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH", "")) if p)
    import drove_watch

    return drove_watch


def _patch_destroy(watch: Watch) -> None:
    """Compare before the program destroys its process group."""

    def patch(dist: Any) -> None:
        destroy = dist.destroy_process_group

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not args and not kwargs.get("group"):
                watch.finish()
            return destroy(*args, **kwargs)

        dist.destroy_process_group = destroy_process_group

    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        patch(dist)
        return
    watch.core.on_import("torch.distributed", patch)


USAGE = "usage: python -m drove.watch [-m module | program.py] [args...]"


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    module = args[0] == "-m"
    if module and len(args) < 2:
        print("drove.watch: -m needs a module name\n" + USAGE, file=sys.stderr)
        return 2
    if not module and args[0].startswith("-"):
        print("drove.watch: unknown option %s\n%s" % (args[0], USAGE), file=sys.stderr)
        return 2
    core = _core()
    watch = Watch(core)
    os.environ[core.SOCKET] = watch.collector.path
    core.on_epoch = lambda loader, epoch: watch.exchange() if loader == 0 and epoch > 0 else None
    core.install()
    _patch_destroy(watch)
    atexit.register(lambda: watch.finish() if not watch.finished else None)
    if module:
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())

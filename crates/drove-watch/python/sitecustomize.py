"""Put on PYTHONPATH by ``drove run``: watch this rank (``drove_watch``), then
run the program's own ``sitecustomize``, the one Python would have imported
without this folder in front."""

import os
import sys


def _watch() -> None:
    try:
        import drove_watch

        drove_watch.install()
    except Exception as e:  # never stop the program over its watcher
        if os.environ.get("DROVE_RANK", os.environ.get("RANK", "0")) == "0":
            print("drove-watch: cannot watch this program: %s" % e, file=sys.stderr, flush=True)


def _next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_watch()
_next_sitecustomize()

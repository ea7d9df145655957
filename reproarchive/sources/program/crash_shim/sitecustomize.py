"""Run in every Python process ``reproarchive capture --`` starts (this folder comes first on
``PYTHONPATH``): runs the program's own ``sitecustomize`` first, if there is one, then asks
``reproarchive.sources.program.crash_guard`` to guard torch.compile's backends against native crashes.
Must never stop the program: a Python without reproarchive simply runs unguarded."""

import importlib.machinery
import importlib.util
import os
import sys


def _run_own_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_run_own_sitecustomize()
try:
    from reproarchive.sources.program.crash_guard import install

    install()
except Exception:  # noqa: BLE001 - another Python, or reproarchive's dependencies missing
    pass

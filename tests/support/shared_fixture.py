"""Expensive fixtures built once per test run, not once per xdist worker.

A session-scoped fixture is built by every worker that needs it: the TORCH_TRACE jobs and the
archives packed from them (real compiles in subprocesses) cost each worker a minute of the two
cores. Here the first worker builds under a file lock in the run's own temporary root (shared
by the workers, new for each run) and writes what it built as JSON; the others wait for the lock
and read it. Without xdist it is an ordinary build."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock

T = TypeVar("T")


def built_once(tmp_path_factory: Any, name: str, build: Callable[[Path], T],
               dump: Callable[[T], Any] = lambda v: v, load: Callable[[Any], T] = lambda v: v) -> T:
    """``build(folder)`` run once for the whole run; ``dump``/``load`` turn its value into JSON data
    and back (the folder's files are shared as they are: tests must treat them as read-only)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # pytest-N/: the run's, above every popen-gwK/
    with FileLock(str(root / f"{name}.lock")):
        done = root / f"{name}.json"
        if done.exists():
            return load(json.loads(done.read_text()))
        folder = root / name
        if folder.exists():  # a worker's build that failed: built again, from nothing
            shutil.rmtree(folder)
        folder.mkdir()
        value = build(folder)
        done.write_text(json.dumps(dump(value)))
        return value

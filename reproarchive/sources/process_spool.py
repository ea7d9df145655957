"""One spool per process and folder, written by one background thread (issue 27.2, 27.3).

The archive a crash would leave is spooled (``archive.spool``) while the backend compiles: the
entry's index first, then its objects, each storage once per process. The graph's first call
waits for its entry (``wait``), so no compiled code runs, and no user code changes an input,
while its bytes are read; a crash while the write is under way (during compilation) still
leaves an entry that completes, with the storages not yet written stored as absent. The
entry is discarded when the graph's first call ends any other way, and the spool removed at a
normal exit: nothing is left behind. Used by the crash guard (``capture --``) and by the
in-process backend with ``spool=True``.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import logging
import os
import threading
from pathlib import Path
from typing import Any

from reproarchive.archive.spool import Spool

SPOOL_PREFIX = "spool-"

log = logging.getLogger("reproarchive.capture")
_lock = threading.Lock()
_spools: dict[tuple[int, Path], ProcessSpool] = {}
_names = itertools.count(1)


class ProcessSpool:
    """``folder/spool-<pid>`` and its writer thread; entries named by a process-wide counter."""

    def __init__(self, folder: Path):
        self.spool = Spool(folder / f"{SPOOL_PREFIX}{os.getpid()}")
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reproarchive-spool")
        self._pending: dict[str, concurrent.futures.Future] = {}

    def submit(self, capture: Any) -> str:
        """Start spooling ``capture`` (the caller must not change its inputs until ``wait``)."""
        name = str(next(_names))
        future = self._writer.submit(self.spool.add, name, capture)
        with _lock:
            self._pending[name] = future
        return name

    def wait(self, name: str) -> bool:
        """Wait until entry ``name`` is on disk, objects and all; False when it could not be
        written (logged: the crash record is lost, not the run)."""
        with _lock:
            future = self._pending.get(name)
        if future is None:
            return False
        try:
            future.result()
        except Exception as err:  # noqa: BLE001 - never in place of the program's own run
            could_not_write(err)
            return False
        return True

    def discard(self, name: str) -> None:
        """The graph's first call ended without a crash: entry ``name`` is not a record."""
        with _lock:
            future = self._pending.pop(name, None)
        if future is not None:
            future.cancel()
            concurrent.futures.wait([future])
        self.spool.discard(name)

    def close(self) -> None:
        with _lock:
            futures = list(self._pending.values())
            self._pending.clear()
        for future in futures:
            future.cancel()
        concurrent.futures.wait(futures)
        self._writer.shutdown(wait=True)
        self.spool.remove()


def spool_in(folder: str | os.PathLike) -> ProcessSpool:
    """This process's spool in ``folder`` (made at its first use; a forked worker makes its
    own), removed at a normal exit."""
    key = (os.getpid(), Path(folder).absolute())
    with _lock:
        found = _spools.get(key)
        if found is None:
            if not any(pid == key[0] for pid, _ in _spools):  # this process's first spool
                atexit.register(_close_all)
            found = _spools[key] = ProcessSpool(key[1])
        return found


def _close_all() -> None:
    """At a normal exit: graphs compiled but never run did not crash either."""
    with _lock:
        own = [s for (pid, _), s in _spools.items() if pid == os.getpid()]
    for spool in own:
        spool.close()


def could_not_write(err: BaseException) -> None:
    log.warning("reproarchive capture: could not write the archive a crash would leave: %s: %s",
                type(err).__name__, err)

"""One spool per process and folder, written by one background thread (issue 27.2, 27.3).

The archive a crash would leave is spooled (``archive.spool``) while the backend compiles: the
storages hashed and the entry's index written first, then its objects, each storage once per
process. The graph's first call waits until the entry is on disk with its small objects
(``wait``): from then on a crash leaves an entry that completes. Where the capture holds copies
of the inputs the graph writes (``submit(..., background=True)``), the large objects (beyond the
first ``FIRST_BYTES``, smallest first) are written while the first call runs: a crash before they
are all written completes with the storages not yet written stored as absent (generated on load,
and said so), never as real; the entry is discarded, and the writes it still had stopped, when
the first call ends any other way. Without those copies (the inputs a graph writes are unknown)
the first call waits for every object, as no input may change while its bytes are read. The
spool is removed at a normal exit: nothing is left behind. Used by the crash guard
(``capture --``) and by the in-process backend with ``spool=True``.
"""

from __future__ import annotations

import atexit
import bisect
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


#: Object bytes an entry writes before its graph's first call may run (smallest objects first):
#: the inputs and small state of a step; a model's large weights are written during the call.
FIRST_BYTES = 64 << 20


class _Entry:
    """One entry being spooled: ``ready`` once the first call may run, ``stop`` to end its
    remaining writes, ``future`` the whole job."""

    def __init__(self):
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self.stop = threading.Event()
        self.future: concurrent.futures.Future | None = None


class ProcessSpool:
    """``folder/spool-<pid>`` and its writer thread; entries named by a process-wide counter."""

    def __init__(self, folder: Path):
        self.spool = Spool(folder / f"{SPOOL_PREFIX}{os.getpid()}")
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reproarchive-spool")
        self._pending: dict[str, _Entry] = {}

    def submit(self, capture: Any, *, background: bool = False) -> str:
        """Start spooling ``capture``. ``background``: its inputs that the graph writes are
        copies, so its large objects may be written while the first call runs; otherwise the
        caller must not change its inputs until ``wait`` returns."""
        name, entry = str(next(_names)), _Entry()
        with _lock:
            self._pending[name] = entry
        entry.future = self._writer.submit(self._spool_entry, name, capture, entry, background)
        return name

    def _spool_entry(self, name: str, capture: Any, entry: _Entry, background: bool) -> None:
        try:
            todo = self.spool.begin(name, capture)
            if background:
                todo.sort(key=lambda job: job[1].nbytes())
                sizes = list(itertools.accumulate(job[1].nbytes() for job in todo))
                first = bisect.bisect_right(sizes, FIRST_BYTES)
                self.spool.write(todo[:first], entry.stop.is_set)
                entry.ready.set_result(True)
                todo = todo[first:]
            self.spool.write(todo, entry.stop.is_set)
        except BaseException as err:
            if not entry.ready.done():
                entry.ready.set_exception(err)
            raise
        if not entry.ready.done():
            entry.ready.set_result(True)

    def wait(self, name: str) -> bool:
        """Wait until entry ``name`` may stand for its graph's first call (module docstring);
        False when it could not be written (logged: the crash record is lost, not the run)."""
        with _lock:
            entry = self._pending.get(name)
        if entry is None:
            return False
        try:
            entry.ready.result()
        except Exception as err:  # noqa: BLE001 - never in place of the program's own run
            could_not_write(err)
            return False
        return True

    def discard(self, name: str) -> None:
        """The graph's first call ended without a crash: entry ``name`` is not a record, and
        the writes it still had are stopped (between two pieces of an object)."""
        with _lock:
            entry = self._pending.pop(name, None)
        if entry is not None:
            entry.stop.set()
            if entry.future is not None:
                entry.future.cancel()
                concurrent.futures.wait([entry.future])
        self.spool.discard(name)

    def close(self) -> None:
        with _lock:
            entries = list(self._pending.values())
            self._pending.clear()
        for entry in entries:
            entry.stop.set()
            if entry.future is not None:
                entry.future.cancel()
        concurrent.futures.wait([e.future for e in entries if e.future is not None])
        self._writer.shutdown(wait=True)
        self.spool.remove()


def protected_inputs(inputs: list[Any], written: frozenset[int] | None) -> tuple[list[Any], bool]:
    """``inputs`` for a capture spooled while the graph may run: the ones the graph writes
    (``written``, ``input_writes.written_inputs``) copied as they are now, and whether they could
    be told (else the first call waits for every object)."""
    from reproarchive.replay.input_writes import snapshot

    return (list(inputs), False) if written is None else (snapshot(inputs, written), True)


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

"""One spool per process and folder, written in the background (issue 27.2, 27.3).

The archive a crash would leave is spooled (``archive.spool``) while the backend compiles: the
storages hashed and the entry's index written first, then its objects, each storage once per
process. Two ways, by where the storages are:

- **In host memory** (and the inputs the graph writes copied, or in no memory shared with
  another process): the entry is drafted when the graph is compiled, then hashed and written by
  a thread at the lowest priority. The first call waits for none of it: if the thread is not
  done, the process forks (``snapshot_writer``) and the child, a copy-on-write snapshot of the
  process at that instant, finishes the entry; a crash during the call leaves the child to
  complete it. The child is killed when the call ends any other way.
- **On a device**: a thread hashes and writes through one pinned host buffer; the first call
  waits until the entry is on disk with its small objects (``wait``). Where the capture holds
  copies of the inputs the graph writes (``submit(..., background=True)``), the large objects
  (beyond the first ``FIRST_BYTES``, smallest first) are written while the first call runs: a
  crash before they are all written completes with the storages not yet written stored as
  absent (generated on load, and said so), never as real. Without those copies the first call
  waits for every object, as no input may change while its bytes are read.

Either way the entry is discarded, and the writes it still had stopped, when the first call
ends without a crash, and the spool is removed at a normal exit: nothing is left behind. Used
by the crash guard (``capture --``) and by the in-process backend with ``spool=True``.
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

from reproarchive.archive.spool import Draft, Spool, Stopped
from reproarchive.sources import snapshot_writer

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
    remaining writes, ``future`` the whole job. Spooled by snapshot: its ``draft``, the objects
    left once its index is on disk (``todo``), whether all are written (``done``), the error
    that ended its writing, and the forked ``writer`` finishing it."""

    def __init__(self):
        self.ready: concurrent.futures.Future = concurrent.futures.Future()
        self.stop = threading.Event()
        self.future: concurrent.futures.Future | None = None
        self.draft: Draft | None = None
        self.todo: list | None = None
        self.done = False
        self.error: BaseException | None = None
        self.writer: snapshot_writer.Writer | None = None
        self.discarded = False


class ProcessSpool:
    """``folder/spool-<pid>`` and its writer thread; entries named by a process-wide counter."""

    def __init__(self, folder: Path):
        self.spool = Spool(folder / f"{SPOOL_PREFIX}{os.getpid()}")
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reproarchive-spool")
        self._low: concurrent.futures.ThreadPoolExecutor | None = None  # the lowest-priority writer
        self._pending: dict[str, _Entry] = {}
        self.writer_memory = 0  # the most memory a forked writer held on its own (bytes)

    def submit(self, capture: Any, *, background: bool = False) -> str:
        """Start spooling ``capture``. ``background``: its inputs that the graph writes are
        copies, so its large objects may be written while the first call runs; otherwise the
        caller must not change its inputs until ``wait`` returns."""
        name, entry = str(next(_names)), _Entry()
        draft = None
        if _on_host(capture.inputs):
            draft = self.spool.draft(name, capture)  # here: a first call may come before a thread is scheduled
            if snapshot_writer.can_fork(draft.storages, inputs_copied=background):
                entry.draft = draft
                with _lock:
                    self._pending[name] = entry
                entry.future = self._lowest().submit(self._spool_draft, entry)
                return name
        with _lock:
            self._pending[name] = entry
        entry.future = self._writer.submit(self._spool_entry, name, capture, entry, background, draft)
        return name

    def _lowest(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._low is None:
            self._low = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reproarchive-spool-low",
                                                              initializer=_lowest_priority)
        return self._low

    def _spool_draft(self, entry: _Entry) -> None:
        """Hash and write a drafted entry until done or told to stop (its first call is due)."""
        try:
            found = self.spool.hash(entry.draft, entry.stop.is_set)
            if entry.stop.is_set():
                return
            entry.todo = self.spool.commit(entry.draft, found)
            if entry.discarded:  # the entry went while it was committed: no trace of it
                self.spool.discard(entry.draft.name)
                return
            entry.done = self.spool.write(entry.todo, entry.stop.is_set)
        except Stopped:
            pass
        except Exception as err:  # noqa: BLE001 - reported by ``wait``, never raised into the job
            entry.error = err

    def _spool_entry(self, name: str, capture: Any, entry: _Entry, background: bool, draft: Draft | None) -> None:
        try:  # a draft made already (host storages no fork can snapshot) is not made again
            draft = draft or self.spool.draft(name, capture)
            todo = self.spool.commit(draft, self.spool.hash(draft))
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
        if entry.draft is not None:
            return self._hand_over(entry)
        try:
            entry.ready.result()
        except Exception as err:  # noqa: BLE001 - never in place of the program's own run
            could_not_write(err)
            return False
        return True

    def _hand_over(self, entry: _Entry) -> bool:
        """A drafted entry's first call is due: stop its thread, and fork a writer for what is
        left (``snapshot_writer``); the call waits for neither (nor for another entry's work
        ahead of this one's in the queue: not started, it never will be)."""
        entry.stop.set()
        entry.future.cancel()
        if entry.done:
            return True
        # Not waited for: at the lowest priority beside a busy core it may not run for long.
        # It stops at its next piece; what both write is the same bytes, renamed into place.
        if entry.error is None:
            try:
                entry.writer = snapshot_writer.start(self.spool, entry.draft, entry.todo)
                return True
            except Exception as err:  # noqa: BLE001 - never in place of the program's own run
                entry.error = err
        could_not_write(entry.error)
        return False

    def discard(self, name: str) -> None:
        """The graph's first call ended without a crash: entry ``name`` is not a record, and
        the writes it still had are stopped (between two pieces of an object)."""
        with _lock:
            entry = self._pending.pop(name, None)
        if entry is not None:
            self._end(entry)
        self.spool.discard(name)

    def _end(self, entry: _Entry) -> None:
        entry.discarded = True
        entry.stop.set()
        if entry.future is not None:
            entry.future.cancel()
            if entry.draft is None:  # a drafted entry's thread removes what it commits late itself
                concurrent.futures.wait([entry.future])
        if entry.writer is not None:
            self.writer_memory = max(self.writer_memory, entry.writer.stop())

    def close(self) -> None:
        with _lock:
            entries = list(self._pending.values())
            self._pending.clear()
        for entry in entries:
            self._end(entry)
        self._writer.shutdown(wait=True)
        if self._low is not None:
            self._low.shutdown(wait=True)
        self.spool.remove()


def _on_host(inputs: list[Any]) -> bool:
    """Whether every tensor of ``inputs`` is in host memory (a subclass by its own device)."""
    import torch

    return all(v.device.type == "cpu" for v in inputs if isinstance(v, torch.Tensor))


def _lowest_priority() -> None:
    """This thread (and the hash threads it starts) at ``snapshot_writer.NICE``."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), snapshot_writer.NICE)
    except (OSError, AttributeError):  # not Linux: the thread keeps the job's priority
        pass


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

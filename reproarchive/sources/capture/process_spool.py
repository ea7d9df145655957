"""One spool per process and folder, written in the background (spec §13).

The archive a crash would leave is spooled (``archive.spool``) while the backend compiles: the
storages hashed and the entry's index written first, then its objects, each storage once per
process. Two ways, by where the storages are:

- **In host memory** (none in memory shared with another process, or the inputs the graph
  writes copied): the entry is drafted when the graph is compiled, then hashed and written by a
  thread at the lowest priority, which never reads a storage the graph writes (nothing is
  copied for the spool). The first call waits for none of it: if the thread is not done, or
  the graph writes more than ``HELD_HERE_BYTES`` of its inputs, the process forks
  (``snapshot_writer``) and the child, a copy-on-write snapshot of the process at that instant,
  finishes the entry; a crash during the call leaves the child to complete it. The child is
  killed when the call ends any other way. Where the thread is done and the inputs the graph
  writes are small (batch-norm statistics), the first call hashes and writes them itself.
  A first call that runs a check before the real call (its backward compiled: the check
  compiles it) finishes the entry itself instead (``wait(fork=False)``): a child alive through
  seconds of compiling would hold a copy of every page the compile writes.
- **On a device**: a thread hashes and writes through one pinned host buffer; the first call
  waits until the entry is on disk with its small objects (``wait``). Where the capture holds
  copies of the inputs the graph writes (they are known: ``submit(..., written=...)``), the large objects
  (beyond the first ``FIRST_BYTES``, smallest first) are written while the first call runs: a
  crash before they are all written completes with the storages not yet written stored as
  absent (generated on load, and said so), never as real. Without those copies the first call
  waits for every object, as no input may change while its bytes are read.

Either way the entry is discarded, and the writes it still had stopped, when the first call
ends without a crash, and the spool is removed at a normal exit: nothing is left behind. Used
by the crash guard (``capture --``), which completes its program's spool itself, and by the
in-process backend (its default, ``spool=True``), whose spool a ``spool_guardian`` completes
into archives if the process dies.
"""

from __future__ import annotations

# Imports inside functions: the crash guard imports this module in every Python process
# `capture --` starts; what writing a spool entry needs is imported when one is written.
import atexit
import bisect
import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import os
import re
import threading
from pathlib import Path
from typing import Any

from reproarchive.archive.spool import Draft, Spool, Stopped
from reproarchive.archive.spool_folder import SPOOL_PREFIX, Completed
from reproarchive.format.schema import FailureRecord, ShapePolicy
from reproarchive.sources.capture import snapshot_writer
from reproarchive.sources.capture.spool_guardian import Guardian

ENTRY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # spec §13

log = logging.getLogger("reproarchive.capture")
_lock = threading.RLock()  # re-entrant: a watched node freed by the collector ends its watch
_spools: dict[tuple[int, Path], ProcessSpool] = {}
_names = itertools.count(1)
_guardians: dict[int, Guardian] = {}


#: Object bytes an entry writes before its graph's first call may run (smallest objects first):
#: the inputs and small state of a step; a model's large weights are written during the call.
FIRST_BYTES = 64 << 20
#: Bytes of the inputs a graph writes that its first call hashes and writes itself, before it
#: runs, once the thread has written the rest (a few milliseconds): batch-norm statistics, not
#: a fork of the whole process for them.
HELD_HERE_BYTES = 4 << 20


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
        self.found: list | None = None  # digests of the storages not held, before the entry is committed
        self.others_written = False  # every storage not held is written
        self.done = False
        self.error: BaseException | None = None
        self.writer: snapshot_writer.Writer | None = None
        self.discarded = False
        self.taken: tuple[bytes, bytes] | None = None  # its files while it is set aside (``set_aside``)


class ProcessSpool:
    """``folder/spool-<pid>`` and its writer thread; entries named by a process-wide counter, or
    by the archive file they complete into, in ``folder``, if the process dies (``guarded``:
    this process's ``spool_guardian`` does that then)."""

    def __init__(self, folder: Path, *, guarded: bool = False, store: str | None = None):
        self._made_folder = not folder.exists()  # then removed at the end, if left empty
        self.spool = Spool(folder / f"{SPOOL_PREFIX}{os.getpid()}")
        self._stores: set[str | None] = set()
        if guarded:
            self.guard(store)
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reproarchive-spool")
        self._low: concurrent.futures.ThreadPoolExecutor | None = None  # the lowest-priority writer
        self._pending: dict[str, _Entry] = {}
        self.writer_memory = 0  # the most memory a forked writer held on its own (bytes)
        self._reaped: list[threading.Thread] = []  # the reapers of stopped writers

    def guard(self, store: str | None) -> None:
        """Have this process's guardian complete this spool if the process dies, and push what
        it completes to ``store`` (each store named once)."""
        if store not in self._stores:
            self._stores.add(store)
            _guardian().guard(self.spool.folder, store)

    def submit(self, capture: Any, *, written: frozenset[int] | None = None, archive: str | None = None) -> str:
        """Start spooling ``capture``, whose graph writes its inputs at positions ``written``
        (None: not known). ``archive``: the file name (in the spool's folder) a guardian
        completes the entry into, if the process dies.

        In host memory, where a fork snapshots them (none in shared memory), nothing is copied:
        the thread never reads the storages the graph writes, and the writer forked at the
        first call reads them as they were before it. Otherwise the inputs the graph writes are
        copied now (``protected_inputs``), and a device entry's first call waits as the module
        docstring says."""
        name, entry = self._name(archive), _Entry()
        if _on_host(capture.inputs):
            draft = self.spool.draft(name, capture)  # here: a first call may come before a thread is scheduled
            if snapshot_writer.can_fork(draft.storages, inputs_copied=False):
                draft.held = _held(draft.storages, capture.inputs, written)
                return self._start_draft(entry, draft)
        inputs, background = protected_inputs(list(capture.inputs), written)
        capture = dataclasses.replace(capture, inputs=inputs)
        draft = None
        if _on_host(capture.inputs):
            draft = self.spool.draft(name, capture)
            if snapshot_writer.can_fork(draft.storages, inputs_copied=background):
                return self._start_draft(entry, draft)
        with _lock:
            self._pending[name] = entry
        entry.future = self._writer.submit(self._spool_entry, name, capture, entry, background, draft)
        return name

    def _start_draft(self, entry: _Entry, draft: Draft) -> str:
        entry.draft = draft
        with _lock:
            self._pending[draft.name] = entry
        entry.future = self._lowest().submit(self._spool_draft, entry)
        return draft.name

    def _name(self, archive: str | None) -> str:
        number = str(next(_names))
        if archive is None or not ENTRY_NAME.fullmatch(archive):
            return number
        with _lock:
            return archive if archive not in self._pending else f"{number}-{archive}"

    def _lowest(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._low is None:
            self._low = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reproarchive-spool-low",
                                                              initializer=_lowest_priority)
        return self._low

    def _spool_draft(self, entry: _Entry) -> None:
        """Hash and write a drafted entry until done or told to stop (its first call is due).
        Storages the graph writes (``held``) are left to the forked writer, which reads them
        as they were before the call: only the others' objects are written here."""
        draft = entry.draft
        try:
            found = self.spool.hash(draft, entry.stop.is_set,
                                    only=[i for i in range(len(draft.storages)) if i not in draft.held])
            if entry.stop.is_set():
                return
            if draft.held:
                entry.found = found
                others = [(d, s) for i, (d, s) in enumerate(zip(found, draft.storages))
                          if i not in draft.held and d is not None]
                entry.others_written = self.spool.write(others, entry.stop.is_set)
                return
            entry.todo = self.spool.commit(draft, found)
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

    def wait(self, name: str, *, fork: bool = True) -> bool:
        """Wait until entry ``name`` may stand for its graph's first call (module docstring);
        False when it could not be written (logged: the crash record is lost, not the run).
        ``fork=False``: a drafted entry is finished here, not by a forked writer (for a check
        run, whose backward compile would keep a writer alive for seconds: ``_finish_here``)."""
        with _lock:
            entry = self._pending.get(name)
        if entry is None:
            return False
        if entry.draft is not None:
            return self._hand_over(entry) if fork else self._finish_here(entry)
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
        if entry.done or self._write_held_here(entry):
            return True
        # Not waited for: at the lowest priority beside a busy core it may not run for long.
        # It stops at its next piece; what both write is the same bytes, renamed into place.
        if entry.error is None:
            try:
                entry.writer = snapshot_writer.start(self.spool, entry.draft, entry.todo, entry.found)
                return True
            except Exception as err:  # noqa: BLE001 - never in place of the program's own run
                entry.error = err
        could_not_write(entry.error)
        return False

    def _finish_here(self, entry: _Entry) -> bool:
        """Finish a drafted entry on this thread, at the job's priority: the thread is stopped
        at its next piece and what it left (every digest where it had not committed the entry,
        then the objects not yet on disk) is done here. For a first call that runs a check
        before the real call: that check compiles the backward (seconds), and a forked writer
        alive through it holds every page the compile writes meanwhile (pinned to one core,
        where the lowest-priority thread hardly runs: 46-47 MiB at 384 MiB of weights); done here,
        it costs the hashing and writing the thread did not do, and nothing while the check runs.
        The storages the graph writes are read as they are before it: the check writes copies."""
        entry.stop.set()
        entry.future.cancel()
        concurrent.futures.wait([entry.future])
        if not entry.done and entry.error is None:
            try:
                entry.done = self.spool.finish(entry.draft, entry.todo, entry.found)
            except Exception as err:  # noqa: BLE001 - reported below, never raised into the job
                entry.error = err
        if entry.error is not None:
            could_not_write(entry.error)
        return entry.done

    def _write_held_here(self, entry: _Entry) -> bool:
        """The thread wrote every storage the graph does not write, and those it writes are small
        (``HELD_HERE_BYTES``): they are hashed and written here, as they are before the call
        changes them, and no writer is forked (page tables copied, a child alive through the
        call, pages copied while it lives)."""
        draft = entry.draft
        if not entry.others_written or sum(draft.storages[i].nbytes() for i in draft.held) > HELD_HERE_BYTES:
            return False
        try:
            entry.todo = self.spool.commit(draft, self.spool.hash(draft, only=draft.held, found=entry.found))
            entry.done = self.spool.write(entry.todo)
        except Exception as err:  # noqa: BLE001 - reported by ``wait``, never raised into the job
            entry.error = err
        return entry.done

    def set_aside(self, name: str) -> None:
        """Entry ``name``'s first call ended, and its compiled backward is still to run in the
        program's own ``backward()`` (``backward_watch``): the entry is taken off disk meanwhile,
        so that a crash in the program's code between the two is not recorded as its graph's,
        and ``restore`` puts it back when the backward begins. Its objects stay; its writes go on.
        Never raises (it runs in the program's calls): a failure is logged."""
        with _lock:
            entry = self._pending.get(name)
        if entry is not None and entry.taken is None:
            try:
                entry.taken = self.spool.take(name)
            except OSError as err:  # the entry stays on disk: a crash meanwhile is recorded as its graph's
                could_not_write(err)

    def restore(self, name: str) -> None:
        """Entry ``name``, set aside, back on disk (its backward begins). Never raises: where it
        cannot be written back, a crash in that backward leaves no archive (logged)."""
        with _lock:
            entry = self._pending.get(name)
        if entry is not None and entry.taken is not None:
            try:
                self.spool.put(name, entry.taken)
            except OSError as err:
                could_not_write(err)
                return
            entry.taken = None

    def keep(self, name: str, failure: FailureRecord, destination: Path, *,
             shapes: ShapePolicy | None = None) -> Completed | None:
        """Entry ``name``, whose graph's first call failed where nothing else records its
        inputs (a device-side assert fails every later use of the device; PyTorch's after_aot
        hook dumps fake copies), completed into an archive of ``failure`` at ``destination``:
        its inputs as they were before the call. The writes it had left run to their end first:
        the job's (after a device error a device copy fails at once, and what it did not write
        is stored as absent), or the forked writer's, which wrote host storages from its
        snapshot of them taken before the call. None where the entry is not pending, or its
        writing failed. ``shapes``: the policy as the compile left it, in place of the entry's
        (written before the compile added its guards)."""
        with _lock:
            entry = self._pending.pop(name, None)
        if entry is None:
            return None
        if entry.draft is None:
            concurrent.futures.wait([entry.future])
        elif entry.writer is not None:
            if not entry.writer.join():
                self.spool.discard(name)
                return None
        elif not entry.done:  # the call came before a writer was forked (``wait`` failed): nothing to keep
            self.spool.discard(name)
            return None
        try:
            return self.spool.complete(name, destination, failure=lambda _written_for: failure, shapes=shapes)
        finally:
            self.spool.discard(name)

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
            held, reaped = entry.writer.stop()
            self.writer_memory = max(self.writer_memory, held)
            self._reaped.append(reaped)

    def settle(self) -> None:
        """Until every writer stopped so far has ended and what it left half-written is gone
        (they are reaped on threads: ``snapshot_writer.Writer.stop``)."""
        reaped, self._reaped = self._reaped, []
        for reaper in reaped:
            reaper.join()

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
        if self._made_folder:
            with contextlib.suppress(OSError):
                self.spool.folder.parent.rmdir()


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


def _held(storages: list[Any], inputs: list[Any], written: frozenset[int] | None) -> frozenset[int]:
    """Positions in ``storages`` of the inputs the graph writes (every one when not known)."""
    import torch

    if written is None:
        return frozenset(range(len(storages)))
    try:
        pointers = {inputs[i].untyped_storage().data_ptr() for i in written if isinstance(inputs[i], torch.Tensor)}
        return frozenset(k for k, s in enumerate(storages) if s.data_ptr() in pointers)
    except (RuntimeError, NotImplementedError):  # a subclass without one storage: none read early
        return frozenset(range(len(storages)))


def protected_inputs(inputs: list[Any], written: frozenset[int] | None) -> tuple[list[Any], bool]:
    """``inputs`` for a capture spooled while the graph may run: the ones the graph writes
    (``written``, ``input_writes.written_inputs``) copied as they are now, and whether they could
    be told (else the first call waits for every object)."""
    from reproarchive.replay.input_writes import snapshot

    return (list(inputs), False) if written is None else (snapshot(inputs, written), True)


def spool_in(folder: str | os.PathLike, *, guarded: bool = False, store: str | None = None) -> ProcessSpool:
    """This process's spool in ``folder`` (made at its first use; a forked worker makes its
    own), removed at a normal exit; ``guarded``: completed into archives in ``folder`` if the
    process dies (``spool_guardian``), and pushed to ``store`` when one is named."""
    key = (os.getpid(), Path(folder).absolute())
    with _lock:
        found = _spools.get(key)
        if found is None:
            if not any(pid == key[0] for pid, _ in _spools):  # this process's first spool
                atexit.register(_close_all)
            found = _spools[key] = ProcessSpool(key[1], guarded=guarded, store=store)
        elif guarded:
            found.guard(store)
        return found


def _close_all() -> None:
    """At a normal exit: graphs compiled but never run did not crash either. The guardian
    ends after the spools are gone (it finds nothing to complete)."""
    with _lock:
        own = [s for (pid, _), s in _spools.items() if pid == os.getpid()]
    for spool in own:
        spool.close()
    if _guardians.get(os.getpid()) is not None:
        _guardians[os.getpid()].close()


def _guardian() -> Guardian:
    """This process's guardian (a forked worker starts its own)."""
    found = _guardians.get(os.getpid())
    if found is None:
        found = _guardians[os.getpid()] = Guardian()
    return found


def could_not_write(err: BaseException) -> None:
    log.warning("reproarchive capture: could not write the archive a crash would leave: %s: %s",
                type(err).__name__, err)

"""The rest of a spool entry written by a forked child: a copy-on-write snapshot.

A graph's first call must not wait for its crash record to be hashed and written (1.4 GiB of
weights take ~0.65 s to hash on two cores, a multiple of a short step), yet a crash during that
call must still leave a complete record: a writer thread dies with its process, and a storage it
had not written yet would be lost (completed as absent). So when the first call is due and the
spool's writer is not done, the process forks (not for a first call that runs a check before the
real call: that call finishes the entry itself, ``ProcessSpool.wait``). The child holds the
process's memory as it was at that instant (the kernel copies a page only when one side writes
it), hashes what is left, writes the entry and its objects, and ends; the parent goes on with
the call at once.

- **The call ends without a crash:** the child is killed, then reaped and its partial files
  removed on a thread (``Writer.stop``). It ran at the lowest priority, so on a busy machine it
  took little from the call.
- **The process dies:** the child is not a thread of it and finishes alone, the machine now
  idle. ``Spool.wait_for_writers`` (its lock, inherited through the fork and released only when
  the child ends) makes ``pack SPOOL`` and ``capture --`` wait for it.

Memory: the child shares every page with the parent; a page is copied only when one side
writes a page both still map. The parent writes most into memory it freed before the fork and
reuses for the call's activations and gradients, so the child first gives back its mapping of
every free page of the C heap (``malloc_trim``: measured, 0.4 GB of weights and four graphs,
the child held +84-130% of the weights without it). What is left is the pages of live objects
the parent writes meanwhile (Python objects whose counts change, the inputs the graph writes,
whose copies the capture already holds). ``Writer.stop`` measures it (the child's private
pages) before killing the child where ``measure_memory`` asks (the benchmark reports it). And
while a writer lives the parent's cyclic garbage collector is kept off the objects that existed
at the fork (``gc.freeze``, as pre-fork servers do): a full collection writes the header of
every object it tracks, so each one would copy the whole Python heap into the child. They are
handed back to it (``gc.unfreeze``) when the last writer is stopped. Where objects are frozen
already (the program, or a library it loaded, called ``gc.freeze``; one GPU image's test run
had 375), they are not ours to unfreeze: automatic collections are paused instead
(``gc.disable``) while a writer lives, and the collector's state given back after; the frozen
ones stay frozen.

The child calls no torch function: torch's thread pools do not survive a fork and a parallel
kernel could wait forever on a pool that is gone. It reads storages through views made before
the fork, uses hashlib, msgpack and the file system, and has a time limit after which it ends.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from reproarchive.archive.spool import Draft, Spool, partial
from reproarchive.codec.tensors import storage_view
from reproarchive.sources.capture import malloc_trim

#: The child's niceness: it takes the cores only when the job leaves them idle.
NICE = 19
#: Read how much memory a writer holds on its own before killing it (``Writer.stop``): 27 ms
#: per graph for a process of 384 MiB of weights (``/proc/<pid>/smaps_rollup`` walks every
#: mapping), on the first call's path, for a figure only the capture-overhead benchmark and the
#: tests use. They turn it on; a job does not pay it.
measure_memory = False

#: The child's time limit: a floor, and more per byte at a slow disk's pace.
_LIMIT_S, _LIMIT_BYTES_PER_S = 600, 10 << 20


def can_fork(storages: list[Any], *, inputs_copied: bool) -> bool:
    """Whether a fork snapshots ``storages``: every one in host memory, and, unless the capture
    holds copies of the inputs the graph writes, none in memory shared with other processes
    (a fork does not snapshot those)."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return False
    if any(s.device.type != "cpu" for s in storages):
        return False
    return inputs_copied or not any(s.is_shared() for s in storages)


_gc_lock = threading.Lock()
_gc_writers = [0]  # writers alive for which the collector is kept off (0: none)
_gc_off: list[str | None] = [None]  # how: "frozen" (gc.freeze), "paused" (gc.disable), None (nothing)


def _keep_gc_off() -> None:
    """Keep the collector off this process's objects for a writer about to be forked (module
    docstring); ``_let_gc_back`` is owed once that writer is stopped."""
    with _gc_lock:
        if _gc_writers[0] == 0:
            if not gc.get_freeze_count():
                gc.freeze()
                _gc_off[0] = "frozen"
            elif gc.isenabled():  # frozen objects that are not ours: pause collections instead
                gc.disable()
                _gc_off[0] = "paused"
            else:
                _gc_off[0] = None
        _gc_writers[0] += 1


def _let_gc_back() -> None:
    with _gc_lock:
        _gc_writers[0] -= 1
        if _gc_writers[0] == 0:
            if _gc_off[0] == "frozen":
                gc.unfreeze()
            elif _gc_off[0] == "paused":
                gc.enable()
            _gc_off[0] = None


class Writer:
    """A forked child finishing one entry."""

    def __init__(self, spool: Spool, pid: int, lock: Path):
        self.spool, self.pid, self.lock = spool, pid, lock
        self._gc_owed = True  # ``_keep_gc_off`` was called for it

    def stop(self) -> tuple[int, threading.Thread]:
        """Kill the child (its entry is not needed); returns the bytes of memory it held on its
        own (pages copied since the fork; 0 unless ``measure_memory``) and the thread that reaps
        it: waits for its end and removes what it left half-written. A killed child writes nothing
        more, but it tears down its copy of the process at the lowest priority: 25 ms for 1.2 GB
        on an idle core, seconds beside a busy loop on that core (measured: the first call took
        2.4x plain's when it waited). Neither the call nor the process's exit waits for it (a
        daemon thread; the spool's removal at exit takes what it would remove)."""
        if self._gc_owed:
            self._gc_owed = False
            _let_gc_back()
        held = private_bytes(self.pid) if measure_memory else 0
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # reaped already (a program's own SIGCHLD handler)
            pass
        reaper = threading.Thread(target=self._reap, name="reproarchive-reaper", daemon=True)
        reaper.start()
        return held, reaper

    def join(self) -> bool:
        """Wait for the child to finish its entry (it is needed: the call failed); whether it
        wrote it all. Bounded by the child's own time limit (``_detach``)."""
        if self._gc_owed:
            self._gc_owed = False
            _let_gc_back()
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped already (a program's own SIGCHLD handler): judge by the lock
            return not self.lock.exists()
        return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

    def _reap(self) -> None:
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:  # reaped already (a program's own SIGCHLD handler)
            pass
        for left in (self.spool.folder / "objects").glob(f"*/{partial(Path('*'), self.pid).name}"):
            left.unlink(missing_ok=True)
        self.lock.unlink(missing_ok=True)


def start(spool: Spool, draft: Draft, todo: list | None, found: list | None = None) -> Writer:
    """Fork a child that finishes ``draft``: hashes its storages (those the graph writes only,
    when ``found`` holds the others' digests) and writes its entry (unless ``todo``, the
    objects left once the entry is on disk, is given), then its objects."""
    views = {id(s): storage_view(s) for s in draft.storages}  # made here: the child calls no torch
    limit = _LIMIT_S + sum(len(v) for v in views.values()) // _LIMIT_BYTES_PER_S
    fd, lock = spool.writer_lock(draft.name)
    _keep_gc_off()
    try:
        with warnings.catch_warnings():  # Python 3.12 warns of fork in a threaded process: see the docstring
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:  # no memory or process left for a child: the caller logs it, the job goes on
        _let_gc_back()
        os.close(fd)
        lock.unlink(missing_ok=True)
        raise
    if pid == 0:  # the child: never returns
        status = 1
        try:
            _detach(keep=fd, limit=limit)
            spool.finish(draft, todo, found, views=views)
            lock.unlink(missing_ok=True)
            status = 0
        finally:
            os._exit(status)
    os.close(fd)  # the child holds the lock now
    return Writer(spool, pid, lock)


def _detach(*, keep: int, limit: int) -> None:
    """The child's own settings: no signal of the job's (Ctrl-C is the parent's to handle; its
    handlers are Python code of a process that is not this one), no descriptor but the lock
    (the job's pipes and sockets must close when the job ends), low priority, a time limit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    faulthandler.disable()  # its report would go to a descriptor closed below, reused for an object
    null = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(null, target)
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
    os.nice(NICE)
    signal.alarm(limit)
    gc.disable()  # a collection here would write every object's header: copied pages, no gain
    # the free pages of the C heap unmapped here: the parent reuses them for the call, and each
    # page it writes that the child still maps is copied
    malloc_trim.trim()


def private_bytes(pid: int) -> int:
    """Memory ``pid`` holds on its own (``Private_Clean`` + ``Private_Dirty``), 0 if unknown."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    total = 0
    for line in text.splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total

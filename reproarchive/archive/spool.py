"""A process-wide, content-addressed spool: each storage written once, archives completed only
when they are kept (spec/FORMAT.md, "Spool").

The archive a native crash would leave has to be on disk before a graph first runs, and a job
compiles many graphs over the same weights (recompiles for new shapes, several graphs of one
model). Writing a complete ``.tar.zst`` for each writes every weight again each time. A spool
writes each distinct storage once, raw, as ``objects/<algorithm>/<hex>``, and for each graph
only a small pending entry: its index (everything an archive's index holds but the container
section) and its readable code. An entry is completed into an ordinary self-contained archive
(``complete``) only when it is kept: a crash, which ``reproarchive pack SPOOL`` or ``capture --``
turns into archives afterwards. A process that ends normally removes its spool.

Crash safety by construction: an object is written to a temporary name and renamed, so an
object that exists is complete; an entry's index is renamed into place after its code, and an
object its index names that never made it is completed as absent (said so, never as real). A
process killed while writing leaves at worst some objects that no entry names. A writer that
outlives its process (``sources.capture.snapshot_writer``: a forked child finishing an entry after a
crash) holds a lock in ``writers/``; readers wait for it before they list entries.

This module writes spools; reading one (``SpoolFolder``: waiting for writers, listing and
completing entries) is ``spool_folder``'s, which needs no torch, and ``Spool`` extends it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import os
from pathlib import Path
from typing import Any, Callable, Collection

from reproarchive.archive.host_staging import MAX_BUFFERS, HostStaging
from reproarchive.archive.packing import ArchiveContents, archive_contents, is_zero_bytes
from reproarchive.archive.spool_folder import (  # noqa: F401 - MARKER, is_spool: this module's names too
    CODE_SUFFIX,
    INDEX_SUFFIX,
    MARKER,
    MARKER_TEXT,
    SpoolFolder,
    is_spool,
)
from reproarchive.archive.writing import Capture
from reproarchive.codec.tensors import storage_view
from reproarchive.context.redaction import redacted, working_folder
from reproarchive.format import digests, index_codec, layout, plain
from reproarchive.format.atomic import atomic_file
from reproarchive.format.parallel import worker_threads

_PIECE = 16 << 20  # bytes written between two looks at ``stop``


class Stopped(Exception):
    """A hash or write was told to stop (the entry it was for is no longer needed, or its
    rest is handed to a forked writer)."""


@dataclasses.dataclass
class Draft:
    """An entry made ready but not yet hashed (``Spool.draft``): what a writer still has to do
    is hash ``storages`` (the real ones of the storage table, in its order) and ``commit``."""

    name: str
    ready: ArchiveContents
    job: Any
    real: list[int]
    storages: list[Any]
    #: positions in ``storages`` the graph writes: read only by a writer forked before the call
    held: frozenset[int] = frozenset()


class Spool(SpoolFolder):
    """One process's spool folder. ``Spool(folder)`` makes it (or opens one that exists)."""

    def __init__(self, folder: str | os.PathLike, *, algorithm: str = digests.DEFAULT_ALGORITHM):
        super().__init__(folder)
        self.algorithm = digests.check_algorithm(algorithm)
        marker = self.folder / MARKER
        (self.folder / "objects").mkdir(parents=True, exist_ok=True)
        (self.folder / "pending").mkdir(exist_ok=True)
        (self.folder / "writers").mkdir(exist_ok=True)
        if not marker.exists():
            marker.write_bytes(MARKER_TEXT)
        self.bytes_written = 0  # object bytes this Spool wrote (not those it found there)
        self.staging = HostStaging()

    # -- writing ----------------------------------------------------------------------------

    def add(self, name: str, capture: Capture, *, prefixes: dict[str, str] | None = None) -> str:
        """Spool ``capture`` (records redacted as ``write_capture`` does) as entry ``name``:
        ``begin`` then ``write``."""
        self.write(self.begin(name, capture, prefixes=prefixes))
        return name

    def begin(self, name: str, capture: Capture, *, prefixes: dict[str, str] | None = None) -> list:
        """Hash ``capture``'s storages and write its entry (index and code): from here on a
        crash leaves an entry that completes. Returns the storages still to write (``write``),
        which the caller must not change until they are written."""
        draft = self.draft(name, capture, prefixes=prefixes)
        return self.commit(draft, self.hash(draft))

    def draft(self, name: str, capture: Capture, *, prefixes: dict[str, str] | None = None) -> Draft:
        """``capture`` encoded as entry ``name`` (records redacted as ``write_capture`` does),
        nothing hashed or written yet."""
        table_prefixes = working_folder() if prefixes is None else dict(prefixes)
        records = redacted(capture.records, table_prefixes)
        ready = archive_contents(capture.graph, list(capture.inputs), records, custom_ops=capture.custom_ops,
                                 rng_states=capture.rng_states, prefixes=table_prefixes)
        real = [sidx for sidx, record in enumerate(ready.table.records) if record.is_real]
        return Draft(name, ready, capture.job, real, [ready.table.sources[sidx] for sidx in real])

    def commit(self, draft: Draft, found: list[str | None]) -> list:
        """Write ``draft``'s entry, its storages' digests ``found`` (``hash``); the storages
        still to write (``write``) are returned."""
        table = draft.ready.table
        todo = []
        for sidx, digest in zip(draft.real, found):
            table.resolve(sidx, digest)
            if digest is not None and not self._object(digest).exists():
                todo.append((digest, table.sources[sidx]))
        index = draft.ready.index(frame_size=layout.DEFAULT_FRAME_SIZE, digest_algorithm=self.algorithm,
                                  job=draft.job)
        pending = self.folder / "pending"
        with atomic_file(pending / f"{draft.name}{CODE_SUFFIX}", fsync=False) as f:
            f.write(draft.ready.code)
        with atomic_file(pending / f"{draft.name}{INDEX_SUFFIX}", fsync=False) as f:
            f.write(index_codec.encode_index(plain.to_plain(index)))
        return todo

    def hash(self, draft: Draft, stop: Callable[[], bool] | None = None,
             views: dict[int, memoryview] | None = None, *, only: Collection[int] | None = None,
             found: list[str | None] | None = None) -> list[str | None]:
        """Each of ``draft``'s storages' digest (None: all zero, stored as a fill), on the
        available cores (hashlib releases the GIL): host ones in place, device ones through
        the staging buffers, at most ``host_staging.MAX_BUFFERS`` at once. ``stop`` asked
        between pieces (``Stopped`` raised); ``views``: the bytes of host storages already at
        hand (a forked writer reads them without calling torch). ``only``: hash just these
        positions, the others taken from ``found``."""
        storages = draft.storages
        out: list[str | None] = list(found) if found is not None else [None] * len(storages)
        chosen = sorted(range(len(storages)) if only is None else only)
        on_host = [i for i in chosen if views is not None or storages[i].device.type == "cpu"]
        on_device = sorted(set(chosen) - set(on_host))

        def one(i: int) -> str | None:
            view = views[id(storages[i])] if views is not None else storage_view(storages[i])
            return _host_digest(view, self.algorithm, stop, torch_ok=views is None)

        def staged(i: int) -> str | None:
            return self.staging.digest(storages[i], self.algorithm)

        for work, positions, most in ((one, on_host, worker_threads()),
                                      (staged, on_device, min(worker_threads(), MAX_BUFFERS))):
            jobs = min(most, len(positions))
            if jobs <= 1:
                for i in positions:
                    out[i] = work(i)
                continue
            with concurrent.futures.ThreadPoolExecutor(jobs, thread_name_prefix="reproarchive-hash") as pool:
                for i, digest in zip(positions, pool.map(work, positions)):
                    out[i] = digest
        return out

    def write(self, todo: list, stop: Callable[[], bool] | None = None,
              views: dict[int, memoryview] | None = None) -> bool:
        """Write the objects ``begin`` left to write, each under a temporary name (``partial``)
        then renamed. ``stop``, asked between pieces of at most ``_PIECE`` bytes: when it says
        so, the object being written is dropped (its temporary file removed) and False
        returned. ``views``: as ``hash`` takes them."""
        for digest, storage in todo:
            target = self._object(digest)
            if target.exists():  # another entry wrote it meanwhile
                continue
            target.parent.mkdir(exist_ok=True)
            chunks = [views[id(storage)]] if views is not None else self.staging.chunks(storage)
            temporary = partial(target, os.getpid())
            try:
                with open(temporary, "wb", buffering=0) as f:
                    for chunk in chunks:
                        for start in range(0, len(chunk), _PIECE):
                            if stop is not None and stop():
                                raise Stopped
                            piece = chunk[start:start + _PIECE]
                            f.write(piece)
                            self.bytes_written += len(piece)
                os.replace(temporary, target)
            except BaseException as err:
                temporary.unlink(missing_ok=True)
                if isinstance(err, Stopped):
                    return False
                raise
        return True

    def finish(self, draft: Draft, todo: list | None = None, found: list[str | None] | None = None,
               views: dict[int, memoryview] | None = None) -> bool:
        """What is left of ``draft``'s entry once its writer thread stopped: where it had not
        committed the entry (``todo`` None), the digests (those of the storages it does not hold
        taken from ``found`` when given) and the entry, then the objects not yet on disk. One
        rule for a forked writer (``views``) and a first call that finishes its entry itself."""
        if todo is None:
            only = draft.held if found is not None else None
            todo = self.commit(draft, self.hash(draft, views=views, only=only, found=found))
        return self.write(todo, views=views)

    def take(self, name: str) -> tuple[bytes, bytes] | None:
        """Entry ``name``'s files (code, index), read and removed: while the program runs its
        own code between a first call and that call's backward, the entry stands for nothing
        (a crash then is not its graph's); ``put`` writes them back when the backward begins.
        Its objects stay. None where the entry is not on disk."""
        pending = self.folder / "pending"
        try:
            code = (pending / f"{name}{CODE_SUFFIX}").read_bytes()
            index = (pending / f"{name}{INDEX_SUFFIX}").read_bytes()
        except FileNotFoundError:
            return None
        self.discard(name)  # the index first: a reader never sees an index without its code
        return code, index

    def put(self, name: str, files: tuple[bytes, bytes]) -> None:
        """Entry ``name`` back on disk from what ``take`` read: the code, then the index."""
        pending = self.folder / "pending"
        for suffix, data in zip((CODE_SUFFIX, INDEX_SUFFIX), files):
            with atomic_file(pending / f"{name}{suffix}", fsync=False) as f:
                f.write(data)

    # -- writers that outlive their process -------------------------------------------------

    def writer_lock(self, name: str) -> tuple[int, Path]:
        """A lock held while entry ``name`` is written by a process of its own: a descriptor
        (a child forked while it is open shares the lock, and holds it after its parent dies)
        and the lock's path, which that writer removes when done."""
        path = self.folder / "writers" / f"{name}.lock"
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd, path


def partial(target: Path, pid: int) -> Path:
    """Where process ``pid`` writes object ``target`` before renaming it: a writer killed
    midway leaves a name its parent can find and remove."""
    return target.with_name(f".{target.name}.{pid}.partial")


_PROBE = 4096


def _host_digest(view: memoryview, algorithm: str, stop: Callable[[], bool] | None, *, torch_ok: bool) -> str | None:
    """``algorithm:hex`` of ``view``, hashed a piece at a time; None when its bytes are all
    zero. ``torch_ok`` False: no torch call (in a forked child, whose torch thread pools are
    gone, one could hang)."""
    hasher = digests.new_hasher(algorithm)
    for start in range(0, len(view), _PIECE):
        if stop is not None and stop():
            raise Stopped
        hasher.update(view[start:start + _PIECE])
    if len(view) and (is_zero_bytes(view) if torch_ok else _all_zero(view)):
        return None
    return f"{algorithm}:{hasher.hexdigest()}"


def _all_zero(view: memoryview) -> bool:
    """``is_zero_bytes`` without torch: a probe of each end, then the whole a piece at a time."""
    for probe in (view[:_PROBE], view[-_PROBE:]):
        if bytes(probe).count(0) != len(probe):
            return False
    zeros = memoryview(bytes(min(_PIECE, len(view))))
    for start in range(0, len(view), _PIECE):
        piece = view[start:start + _PIECE]
        if piece != zeros[:len(piece)]:
            return False
    return True

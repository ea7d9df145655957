"""Reading a spool (spec/FORMAT.md §13) without torch: the entries a dead process left, each
completed into an ordinary archive.

Apart from ``spool`` (which writes spools, and imports torch to read storages), so that the
process that completes a dead process's spool (``sources.capture.spool_guardian``) and ``reproarchive
pack SPOOL`` start in a fraction of a second: completing is format work, checked by the
container writer, and never reads a tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import mmap
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from reproarchive.context.redaction import redacted_records, working_folder
from reproarchive.errors import PackError, SourceError
from reproarchive.format import digests, index_codec, layout, plain
from reproarchive.format.atomic import atomic_file
from reproarchive.format.schema import FailureRecord, Index, ShapePolicy, StorageRecord
from reproarchive.format.writer import ContainerWriter

MARKER = "REPROARCHIVE-SPOOL"
#: A process's spool folder in a capture's scratch folder: ``spool-PID`` (``process_spool``).
#: Here, not there, so that finding a crashed program's spools imports no torch.
SPOOL_PREFIX = "spool-"
MARKER_TEXT = b"reproarchive spool 2\n"
#: Markers this reader completes: spool 1 had no ``writers/`` (nothing to wait for).
READ_MARKERS = (b"reproarchive spool 1\n", MARKER_TEXT)
#: an entry's files in ``pending/`` (spec §13)
INDEX_SUFFIX, CODE_SUFFIX = ".index", ".code"
_MAX_ENTRY_INDEX = 256 << 20


def is_spool(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the spool folder a process left (``pack`` tells it from a dump by this)."""
    return (Path(path) / MARKER).is_file()


@dataclasses.dataclass(frozen=True)
class Completed:
    """An entry completed into an archive: ``absent`` of its storages had no object (the
    process died writing them) and are stored as absent."""

    name: str
    path: Path
    absent: int

    @property
    def unwritten(self) -> str:
        """What a message about it adds for the storages stored as absent ("" when none)."""
        return f"; {self.absent} storage(s) not written yet stored as absent" if self.absent else ""


class SpoolFolder:
    """A spool's folder, read: ``SpoolFolder(folder)`` opens one and refuses a folder without a
    marker this reader knows."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        marker = self.folder / MARKER
        if self.folder.exists() and not marker.is_file():
            raise SourceError(f"{self.folder} is not a reproarchive spool (no {MARKER} file)",
                              "name the folder a capture left (its name starts with spool-)")
        if marker.is_file() and marker.read_bytes() not in READ_MARKERS:
            raise SourceError(f"{self.folder} is a spool of a newer reproarchive ({marker.read_bytes()[:40]!r})",
                              "pack it with the reproarchive version that captured it")

    def wait_for_writers(self) -> None:
        """Until no process is writing an entry (a forked writer finishing after a crash)."""
        for lock in sorted((self.folder / "writers").glob("*.lock")):
            try:
                fd = os.open(lock, os.O_RDONLY)
            except FileNotFoundError:  # its writer finished meanwhile
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
            finally:
                os.close(fd)

    def _object(self, digest: str) -> Path:
        algorithm, hexdigest = digests.parse(digest)
        return self.folder / "objects" / algorithm / hexdigest

    def discard(self, name: str) -> None:
        """Forget entry ``name`` (its graph ran without crashing); objects stay for others."""
        for suffix in (INDEX_SUFFIX, CODE_SUFFIX):
            (self.folder / "pending" / f"{name}{suffix}").unlink(missing_ok=True)

    def remove(self) -> None:
        """The whole spool: at a normal exit nothing is left behind."""
        shutil.rmtree(self.folder, ignore_errors=True)

    # -- reading ----------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The entries a crash left, oldest first (once every writer has finished)."""
        self.wait_for_writers()
        found = [p for p in (self.folder / "pending").glob(f"*{INDEX_SUFFIX}") if p.is_file()]
        return [p.name[: -len(INDEX_SUFFIX)] for p in sorted(found, key=lambda p: (p.stat().st_mtime, p.name))]

    def complete_each(self, destination: Callable[[str], Path],
                      on_error: Callable[[str, Exception], None] | None = None,
                      failure: Callable[[FailureRecord], FailureRecord] | None = None) -> Iterator[Completed]:
        """Every entry a crash left, oldest first, completed into ``destination(name)`` (and its
        failure made by ``failure``, as ``complete`` says); the spool is removed once all are.
        An entry that cannot be completed ends it, the spool kept for another try, unless
        ``on_error`` takes the error (then the others go on)."""
        for name in self.names():
            try:
                yield self.complete(name, destination(name), failure=failure)
            except Exception as err:
                if on_error is None:
                    raise
                on_error(name, err)
        self.remove()

    def complete(self, name: str, destination: str | os.PathLike, *,
                 failure: Callable[[FailureRecord], FailureRecord] | None = None,
                 shapes: ShapePolicy | None = None) -> Completed:
        """Entry ``name`` as an ordinary self-contained archive at ``destination`` (atomically):
        the writer checks the index against every rule of the spec before writing it.
        ``failure``: the failure it records, made from the crash its entry was written for (the
        process lived and knows what went wrong, or its guardian learned the signal). ``shapes``:
        the shape policy in place of the entry's, which was written before the compile ended."""
        pending = self.folder / "pending"
        raw = (pending / f"{name}{INDEX_SUFFIX}").read_bytes()
        if len(raw) > _MAX_ENTRY_INDEX:
            raise PackError(f"spool entry {name} has an index of {len(raw)} bytes", "this is not a spool we wrote")
        try:
            index = plain.from_plain(Index, index_codec.decode_index(raw, max_memory=_MAX_ENTRY_INDEX))
        except Exception as err:  # noqa: BLE001 - a damaged entry: one line, no traceback
            raise PackError(f"spool entry {name} cannot be read: {err}", "the spool is damaged") from None
        code = (pending / f"{name}{CODE_SUFFIX}").read_bytes()
        if failure is not None:  # redacted as a capture's records are (``archive.writing``: the working directory ".")
            made = redacted_records({"failure": failure(index.records.failure)}, working_folder())["failure"]
            index = dataclasses.replace(index, records=dataclasses.replace(index.records, failure=made))
        if shapes is not None:
            index = dataclasses.replace(index, records=dataclasses.replace(index.records, shapes=shapes))
        index, absent = self._with_missing_absent(index)
        # the mappings stay open until the writer is done: its frames may still read them
        with contextlib.ExitStack() as mappings, atomic_file(destination) as f:
            writer = ContainerWriter(f, frame_size=index.container.frame_size)
            try:
                writer.add_member(layout.GRAPH_CODE_MEMBER, code)
                done: set[str] = set()
                for record in index.storages:
                    if record.digest is None or record.digest in done:
                        continue
                    data = mappings.enter_context(self._mapped(record.digest, record.size))
                    writer.add_member(digests.blob_member_name(record.digest), data, keep=data)
                    done.add(record.digest)
                writer.finish(index)
            except BaseException:
                writer.abandon()
                raise
        return Completed(name, Path(destination), absent)

    def _with_missing_absent(self, index: Index) -> tuple[Index, int]:
        """The entry of a process that died while its objects were written: each storage whose
        object never made it is stored as absent (generated on load, and said so), never as real;
        a generator state among them is left out of ``rng`` (unknown, as a dump's). With the
        number of storages so stored."""
        storages = tuple(StorageRecord(size=r.size, device=r.device, fidelity="absent")
                         if r.digest is not None and not self._object(r.digest).exists() else r
                         for r in index.storages)
        absent = sum(new is not old for new, old in zip(storages, index.storages))
        if not absent:
            return index, 0
        rng = index.records.rng
        if rng is not None:  # a generator state that never made it is unknown, not generated
            kept = tuple(g for g in rng.generators if storages[g.storage].is_real)
            rng = dataclasses.replace(rng, generators=kept)
        return dataclasses.replace(index, storages=storages,
                                   records=dataclasses.replace(index.records, rng=rng)), absent

    @contextlib.contextmanager
    def _mapped(self, digest: str, size: int):
        """The object ``digest``, mapped and checked: its size and its hash."""
        try:
            f = open(self._object(digest), "rb")
        except FileNotFoundError:
            raise PackError(f"spool object {digest} is missing", "the spool is damaged") from None
        with f:
            found = os.fstat(f.fileno()).st_size
            if found != size:
                raise PackError(f"spool object {digest} holds {found} bytes, not {size}", "the spool is damaged")
            if size == 0:
                yield b""
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                if digests.of_bytes(data, digests.parse(digest)[0]) != digest:
                    raise PackError(f"spool object {digest} does not hash to its name", "the spool is damaged")
                yield data

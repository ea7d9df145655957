"""Where a fleet's archives come from (a folder, a file listing them, a team store), each read
as a ``Member`` with its signature, and where their verdicts and minified archives go."""

from __future__ import annotations

import dataclasses
import errno
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from reproarchive.errors import ArchiveError, ReproArchiveError
from reproarchive.format.plain import PlainRecord
from reproarchive.format.reader import ContainerReader
from reproarchive.store import objects
from reproarchive.store.location import is_reference, is_store, open_location
from reproarchive.store.pull import archive_view, open_store
from reproarchive.triage.grouping import Signature, signature_of

#: For a folder of archives: the local store holding verdicts and minified archives.
CACHE_FOLDER = ".reproarchive-triage"

ProgressFn = Callable[[dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class Unreadable(PlainRecord):
    location: str
    error: str


@dataclasses.dataclass(frozen=True)
class Member(PlainRecord):
    """One archive of the fleet: where it is, its index digest, when it was seen (file time, or
    when it was pushed), its size in ops, and how much code from outside torch its graph calls
    (``outside``: custom ops and user Triton kernels, which a replay where they are not
    registered stands in for from their recorded calls)."""

    name: str
    location: str
    digest: str
    seen: str
    ops: int
    nodes: int
    outside: int = 0


# --------------------------------------------------------------------------------------------
# sources: a folder, a list, a store


class Source:
    """The archives of one source, and where its verdicts and minified archives go."""

    def __init__(self, text: str, entries: list[tuple[str, str, str | None]], store_url: str | None,
                 folder: Path | None, storage_options: dict | None):
        self.text, self.entries, self.store_url, self.folder = text, entries, store_url, folder
        self.storage_options = storage_options

    @classmethod
    def open(cls, source: str | os.PathLike, storage_options: dict | None) -> Source:
        text = os.fspath(source)
        if is_store(text):
            return cls(text, _store_entries(text, storage_options), text, None, storage_options)
        path = Path(text).absolute()  # each task runs in a folder of its own: no name may be relative
        if path.is_dir():
            files = sorted(p for p in path.rglob("*.tar.zst") if CACHE_FOLDER not in p.parts)
            return cls(text, [(str(p), p.name, None) for p in files], None, path, None)
        if path.is_file():
            if path.name.endswith((".tar.zst", ".zst")):
                raise ReproArchiveError(f"{text} is one archive; triage takes a fleet of them",
                                        "give a folder of archives, a file listing them, or a store")
            lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
            lines = [ln for ln in lines if ln and not ln.startswith("#")]
            entries = [(str((path.parent / ln)) if not _is_reference(ln) and not os.path.isabs(ln) else ln,
                        Path(ln).name, None) for ln in lines]
            return cls(text, entries, None, path.parent, None)
        raise FileNotFoundError(errno.ENOENT, "no such folder, list or store", text)

    def cache_store(self):
        if self.store_url is not None:
            return open_location(self.store_url, **(self.storage_options or {}))
        return open_location(str((self.folder / CACHE_FOLDER).resolve()))

    def minify_output(self) -> str:
        if self.store_url is not None:
            return self.store_url
        return str((self.folder / CACHE_FOLDER / "minified").resolve())

    def sign(self, progress: ProgressFn | None) -> tuple[list, list, dict, dict]:
        """(members, unreadable archives, location -> signature, index digest -> recorded backend)."""
        members, unreadable, signatures, backends = [], [], {}, {}
        for k, (location, name, seen) in enumerate(self.entries, 1):
            try:
                member, sig, backend = _read_member(location, name, seen, self.storage_options)
            except (ArchiveError, ReproArchiveError, OSError) as err:
                unreadable.append(Unreadable(location=location, error=_one_line(err)))
                continue
            if member is None:
                continue  # a minified archive (triage's own, pushed to the store): not an occurrence
            members.append(member)
            signatures[location] = sig
            backends[member.digest] = backend
            if progress is not None and (k % 50 == 0 or k == len(self.entries)):
                progress({"event": "signed", "done": k, "total": len(self.entries)})
        return members, unreadable, signatures, backends


def _one_line(err: BaseException) -> str:
    if isinstance(err, OSError):
        return f"cannot read: {err.strerror or err}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def _is_reference(text: str) -> bool:
    return "://" in text or is_reference(text)


def _store_entries(url: str, storage_options: dict | None) -> list[tuple[str, str, str | None]]:
    store = open_store(url, storage_options)
    keys = [k for k in store.list("refs") if objects.NAME_RE.match(k.rsplit("/", 1)[1])]
    entries = []
    for key, data in sorted(store.read_many(keys).items()):
        name = key.rsplit("/", 1)[1]
        pushed = None
        if not isinstance(data, BaseException):
            try:
                pushed = objects.decode_ref(name, data).pushed
            except ArchiveError:
                pass
        entries.append((f"{url.rstrip('/')}/{name}", name, pushed))
    return entries


def _read_member(location: str, name: str, seen: str | None,
                 storage_options: dict | None) -> tuple[Member, Signature | None, str | None]:
    if _is_reference(location):
        with archive_view(location, storage_options) as (path, _):
            return _member_of(path, location, name, seen)
    if seen is None:
        seen = datetime.fromtimestamp(os.stat(location).st_mtime, timezone.utc).isoformat(timespec="seconds")
    return _member_of(location, location, name, seen)


def _member_of(path, location: str, name: str, seen: str | None) -> tuple[Member | None, Signature | None, str | None]:
    """The member an archive is, its signature and its recorded backend; (None, None, None) for
    a minified archive (it records a parent): derived from a member, not another occurrence."""
    with ContainerReader(path) as reader:
        index, digest = reader.index, reader.index_digest
    if index.records.parent is not None:
        return None, None, None
    member = Member(name=name, location=location, digest=digest, seen=str(seen or ""),
                    ops=index.graph.op_count(), nodes=len(index.graph.nodes),
                    outside=len(index.custom_ops or ()) + len(index.triton_kernels or ()))
    return member, signature_of(index), index.records.backend

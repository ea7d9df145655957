"""``pull``: rebuild an archive from a store, byte for byte, and prove it is the one named.

The archive object says which bytes go where; blob objects are fetched in parallel, each
checked against the size and sha256 its archive recorded (a damaged or replaced blob is named
and nothing is written), the rebuilt file must hash to the archive's digest, and then it is
verified like any archive from someone else (spec §9: every frame, every blob against its
name; whether this torch can build it is ``run``'s question, not a transport's). Only then
does it appear under its final name. Stored frames are copied, never recompressed, so the
bytes do not depend on this machine's zstd.

``fetch`` is pull into a cache keyed by digest (what ``run`` and ``load`` use), and
``archive_view`` reads the archive object alone: it lays the inline bytes out in a
sparse file, so the ordinary reader finds footer, seek table and index where they belong
without a single blob being downloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from reproarchive.archive.checking import verify_bytes
from reproarchive.errors import ArchiveError, CorruptStoreError, SourceError, StoreNotFoundError
from reproarchive.format.atomic import atomic_path
from reproarchive.format.parallel import run_all
from reproarchive.format.reader import ContainerReader
from reproarchive.progress import ProgressFn
from reproarchive.store import objects
from reproarchive.store.backend import CHUNK_BYTES, Store
from reproarchive.store.location import open_location, split_reference
from reproarchive.store.objects import ArchiveObject, BlobCheck, BlobSegment, Ref
from reproarchive.store.push import DEFAULT_JOBS

CACHE_ENV = "REPROARCHIVE_CACHE"


@dataclasses.dataclass
class PullResult:
    reference: str
    path: Path
    name: str | None
    digest: str
    size: int
    blobs: int
    downloaded_bytes: int
    index_digest: str | None = None  # what inspect/verify/diff print; ``digest`` is the file's

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "path": str(self.path), "file_digest": self.digest}


@dataclasses.dataclass(frozen=True)
class Resolved:
    store: Store
    name: str | None  # the ref's name, when the reference was a name
    digest: str
    ref: Ref | None


def open_store(url: str | os.PathLike, storage_options: dict | None = None) -> Store:
    """A store that exists: its marker is there and of a layout this version reads."""
    store = open_location(url, **(storage_options or {}))
    store.refresh()
    try:
        marker = store.read_small(objects.MARKER_KEY, objects.MAX_MARKER_BYTES)
    except StoreNotFoundError:
        missing = store.missing_root()
        if missing:
            raise StoreNotFoundError(f"{store.url}: {missing}", "check the URL, and the endpoint (AWS_ENDPOINT_URL) "
                                     "and account it is looked up in") from None
        raise StoreNotFoundError(f"{store.url} is not a reproarchive store (it has no {objects.MARKER_KEY} marker)",
                                 "check the URL; `reproarchive push ARCHIVE STORE` creates a store") from None
    objects.check_marker(marker, store.url)
    return store


def resolve(reference: str, storage_options: dict | None = None) -> Resolved:
    """``STORE/NAME`` or ``STORE/DIGEST-PREFIX`` -> the archive's digest. A name wins over a
    prefix; a prefix must name exactly one archive. A digest prefix may be the archive file's
    (what ``push``, ``ls`` and ``pull`` print as "file sha256:") or its index's (what
    ``inspect``, ``verify`` and ``diff`` print as "index sha256:"), with or without the label,
    ``sha256:`` and a trailing "..."."""
    url, target = split_reference(reference)
    store = open_store(url, storage_options)
    if objects.NAME_RE.match(target) and store.size(objects.ref_key(target)) is not None:
        ref = objects.decode_ref(target, store.read_small(objects.ref_key(target), objects.MAX_REF_BYTES))
        return Resolved(store, target, ref.archive, ref)
    m = objects.HEX_PREFIX_RE.match(target)
    if m is None:
        raise StoreNotFoundError(f"{store.url} has no archive named {target!r}",
                                 f"`reproarchive ls {store.url}` lists the names")
    prefix, kind = m.group(2), m.group(1)
    hexes = [k.rsplit("/", 1)[1] for k in store.list("archives/sha256")] if kind != "index" else []
    matches = sorted(h for h in hexes if h.startswith(prefix) and objects.SHA256_RE.match("sha256:" + h))
    if not matches and kind != "file":
        matches = _by_index_digest(store, prefix)
    if not matches:
        what = {"file": "whose file digest", "index": "whose index digest"}.get(kind, "whose file or index digest")
        raise StoreNotFoundError(f"{store.url} has no archive named {target!r} and none {what} starts with {prefix}",
                                 f"`reproarchive ls {store.url}` lists the names")
    if len(matches) > 1:
        raise StoreNotFoundError(f"{prefix} is the start of {len(matches)} archive digests in {store.url} "
                                 f"({', '.join(h[:16] for h in matches[:4])}{' ...' if len(matches) > 4 else ''})",
                                 "give more digits")
    return Resolved(store, None, "sha256:" + matches[0], None)


def _by_index_digest(store: Store, prefix: str) -> list[str]:
    """The archives (file digests, hex) whose index digest starts with ``prefix``: what a ref
    says is only a hint, so each candidate's archive object must say it too. Refs written
    before refs carried the index digest cost one archive object read each."""
    refs = [k for k in store.list("refs") if objects.NAME_RE.match(k.rsplit("/", 1)[1])]
    candidates = set()
    for key, data in store.read_many(refs).items():
        try:
            ref = objects.decode_ref(key.rsplit("/", 1)[1], data) if isinstance(data, bytes) else None
        except ArchiveError:
            continue
        hint = ref.summary.index_digest if ref else None
        if ref is not None and (hint is None or hint.split(":")[1].startswith(prefix)):
            candidates.add(ref.archive)
    found = {d.split(":")[1] for d in candidates
             if read_archive_object(store, d).index_digest.split(":")[1].startswith(prefix)}
    return sorted(found)


def read_archive_object(store: Store, digest: str) -> ArchiveObject:
    key = objects.archive_key(digest)
    try:
        data = store.read_small(key, objects.MAX_ARCHIVE_OBJECT_BYTES)
    except StoreNotFoundError:
        raise StoreNotFoundError(f"{store.url} names archive {digest[:19]}... but does not hold it",
                                 "its push was interrupted or the object was deleted; push the archive again") from None
    return objects.decode_archive_object(digest, data)


def default_output(resolved: Resolved) -> Path:
    return Path(f"{resolved.name or resolved.digest.split(':')[1][:12]}.tar.zst")


def pull(reference: str, output: str | os.PathLike | None = None, *, jobs: int = DEFAULT_JOBS,
         progress: ProgressFn | None = None, storage_options: dict | None = None, force: bool = False) -> PullResult:
    """Rebuild the archive ``reference`` names at ``output`` (default ``./NAME.tar.zst``).

    An existing file there is left alone when it already is this archive (nothing is
    downloaded) and refused when it is not, unless ``force``."""
    resolved = resolve(reference, storage_options)
    out = Path(output) if output is not None else default_output(resolved)
    if out.is_dir() or os.fspath(output or "").endswith(("/", os.sep)):
        out = out / default_output(resolved)
    archive = read_archive_object(resolved.store, resolved.digest)
    already = _holds(out, archive)
    if out.is_file() and not already and not force:
        raise SourceError(f"{out} already exists and is not the archive {resolved.digest[:19]}...",
                          "pass --force (force=True) to replace it, or -o another file")
    downloaded = 0 if already else rebuild(resolved.store, archive, out, jobs=jobs, progress=progress)
    return PullResult(reference, out, resolved.name, resolved.digest, archive.size, len(archive.blobs()), downloaded,
                      archive.index_digest)


def _holds(path: Path, archive: ArchiveObject) -> bool:
    """Whether ``path`` is already the archive (its size, then its sha256)."""
    if not path.is_file() or path.stat().st_size != archive.size:
        return False
    with open(path, "rb", buffering=0) as f:
        return _sha256_of(f.fileno(), archive.size, None) == archive.digest


def rebuild(store: Store, archive: ArchiveObject, out: Path, *, jobs: int = DEFAULT_JOBS,
            progress: ProgressFn | None = None) -> int:
    """Write ``archive`` to ``out`` from its segments, check it, and only then name it ``out``."""
    with atomic_path(out) as tmp:
        with open(tmp, "r+b", buffering=0) as f:
            fd = f.fileno()
            os.ftruncate(fd, archive.size)
            offsets = _offsets(archive)
            for seg, offset in zip(archive.segments, offsets):
                if not isinstance(seg, BlobSegment):
                    _pwrite_all(fd, seg, offset)
            downloaded = _download_blobs(store, archive, offsets, fd, jobs, progress)
            actual = _sha256_of(fd, archive.size, progress)
            if actual != archive.digest:
                raise CorruptStoreError(
                    f"the archive rebuilt from {store.url} hashes to {actual[:19]}..., not {archive.digest[:19]}...",
                    "the store's archive object is damaged or hostile; `reproarchive push --repair GOOD_COPY "
                    f"{store.url}` writes it again from a good copy")
            os.fsync(fd)
        verify_bytes(tmp, progress=progress)  # every frame and every blob against its name, as for any archive
    return downloaded


def _offsets(archive: ArchiveObject) -> list[int]:
    out, pos = [], 0
    for seg in archive.segments:
        out.append(pos)
        pos += seg.size if isinstance(seg, BlobSegment) else len(seg)
    return out


def _download_blobs(store: Store, archive: ArchiveObject, offsets: list[int], fd: int, jobs: int, progress) -> int:
    work = [(seg, off) for seg, off in zip(archive.segments, offsets) if isinstance(seg, BlobSegment)]
    if not work:
        return 0
    total = sum(seg.size for seg, _ in work)
    lock = threading.Lock()
    done = [0]

    def one(seg: BlobSegment, offset: int) -> None:
        check = BlobCheck(seg, hint=objects.repair_hint(store.url))
        pos = offset
        for chunk in store.iter_object(seg.key, seg.size):
            check.update(chunk)  # never writes past the segment: a longer object fails here
            _pwrite_all(fd, chunk, pos)
            pos += len(chunk)
            with lock:
                done[0] += len(chunk)
                if progress:
                    progress("pull", done[0], total)
        check.finish()

    def guarded(seg: BlobSegment, offset: int) -> None:
        try:
            one(seg, offset)
        except StoreNotFoundError:
            raise CorruptStoreError(f"blob {seg.blob} (object {seg.key}) is missing from {store.url}",
                                    "the store lost it; push an archive holding it again") from None

    run_all(lambda item: guarded(*item), work, jobs=jobs, name="reproarchive-pull")
    return total


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _sha256_of(fd: int, size: int, progress) -> str:
    h = hashlib.sha256()
    for pos in range(0, size, CHUNK_BYTES):
        h.update(os.pread(fd, min(CHUNK_BYTES, size - pos), pos))
        if progress:
            progress("check", min(pos + CHUNK_BYTES, size), size)
    return "sha256:" + h.hexdigest()


# --------------------------------------------------------------------------------------------
# what run, load and inspect use


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reproarchive" / "archives"


def fetch(reference: str, *, progress: ProgressFn | None = None, storage_options: dict | None = None) -> Path:
    """A local copy of the archive ``reference`` names, pulled once into the cache (named by
    its digest, so a later fetch of the same archive downloads nothing)."""
    resolved = resolve(reference, storage_options)
    path = cache_dir() / f"{resolved.digest.split(':')[1]}.tar.zst"
    if path.is_file():
        return path
    archive = read_archive_object(resolved.store, resolved.digest)
    rebuild(resolved.store, archive, path, progress=progress)
    return path


@contextlib.contextmanager
def archive_view(reference: str, storage_options: dict | None = None) -> Iterator[tuple[Path, Resolved]]:
    """A sparse local file holding only an archive's inline bytes (no blob data): enough for
    the index, its records and the frame table. Reading a blob from it fails its checksum."""
    resolved = resolve(reference, storage_options)
    archive = read_archive_object(resolved.store, resolved.digest)
    with tempfile.TemporaryDirectory(prefix="reproarchive-view-") as tmp:
        path = Path(tmp) / "archive.tar.zst"
        with open(path, "wb", buffering=0) as f:
            os.ftruncate(f.fileno(), archive.size)
            for seg, offset in zip(archive.segments, _offsets(archive)):
                if not isinstance(seg, BlobSegment):
                    _pwrite_all(f.fileno(), seg, offset)
        with ContainerReader(path) as reader:
            if reader.index_digest != archive.index_digest:
                raise CorruptStoreError(f"the archive object {archive.digest[:19]}... holds an index other than the "
                                        "one it declares",
                                        "the store is damaged or hostile")
        yield path, resolved

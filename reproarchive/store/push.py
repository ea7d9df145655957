"""``push``: put archives in a store, uploading only the blobs it does not hold yet.

The order is what makes a store safe to read while others write to it (spec §11.3), as in
an OCI registry: blobs first (checked against their names before they go, so a damaged
archive can never put wrong bytes under a digest that other archives will share), then the
archive object, then the ref. A push interrupted anywhere leaves no name pointing at
anything incomplete; the next push of the same archive uploads only what is still missing.
Two pushes sharing blobs may run at once: they write the same bytes under the same keys.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import hashlib
import itertools
import os
import threading
from pathlib import Path

from reproarchive.errors import StoreNotFoundError, TruncatedArchiveError
from reproarchive.format import layout
from reproarchive.format.parallel import run_all
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import Index, TensorValue
from reproarchive.progress import ProgressFn
from reproarchive.store import objects
from reproarchive.store.backend import CHUNK_BYTES, Store
from reproarchive.store.location import open_location
from reproarchive.store.objects import ArchiveObject, BlobCheck, BlobSegment, Ref, RefFailure, RefSummary

DEFAULT_JOBS = 8
STORE_ENV = "REPROARCHIVE_STORE"


@dataclasses.dataclass
class PushResult:
    archive: Path
    store: str
    name: str
    digest: str
    size: int
    blobs: int  # blob objects the archive uses
    uploaded_blobs: int
    uploaded_bytes: int  # everything written: blobs, archive object, ref
    replaced: str | None  # the digest the name pointed to before, when it moved
    index_digest: str | None = None  # what inspect/verify/diff print; ``digest`` is the file's
    repaired_blobs: tuple[str, ...] = ()  # blob objects found damaged in the store and replaced by ours

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "archive": str(self.archive), "file_digest": self.digest}


def default_name(path: str | os.PathLike, digest: str) -> str:
    """``<file stem>-<12 hex of the archive digest>``: readable, and unique per content, so
    every failure a CI job pushes keeps its own name and pushing the same file again is a no-op."""
    stem = Path(path).name
    for suffix in (".tar.zst", ".tzst", ".zst"):
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    stem = "".join(c if c.isalnum() or c in "._+-" else "-" for c in stem).lstrip("._+-")[:100] or "archive"
    return f"{stem}-{digest.split(':')[1][:12]}"


def push(archives, store: str | os.PathLike, *, name: str | None = None, jobs: int = DEFAULT_JOBS,
         progress: ProgressFn | None = None, storage_options: dict | None = None,
         repair: bool = False) -> list[PushResult]:
    """Push each archive (a path or a list of paths) to ``store``; see the module docstring.

    ``name`` names a single archive (default: ``default_name``). A blob the store already holds
    with the right size is reused unread, unless a check recorded it damaged (``fsck``) or
    ``repair`` asks to read back every such blob: then one whose frames differ from ours is
    replaced by ours (checked against its name first). Raises ``StoreError`` when the store
    fails, an ``ArchiveError`` when an archive is damaged (nothing of it is named then).
    """
    paths = [archives] if isinstance(archives, (str, os.PathLike)) else list(archives)
    if name is not None and len(paths) != 1:
        raise ValueError("name= names one archive; push several without it")
    if name is not None:
        objects.check_name(name)
    target = open_location(store, **(storage_options or {}))
    target.check_writable()
    target.refresh()
    _ensure_marker(target)
    return [_push_one(Path(p), target, name, jobs, progress, repair) for p in paths]


def _ensure_marker(store: Store) -> None:
    if store.size(objects.MARKER_KEY) is None:
        missing = store.missing_root()
        if missing:
            raise StoreNotFoundError(f"{store.url}: {missing}", "create it first (a push creates a store inside an "
                                     "existing bucket), or check the URL and the endpoint (AWS_ENDPOINT_URL)")
        store.write(objects.MARKER_KEY, objects.marker_bytes())
    else:
        objects.check_marker(store.read_small(objects.MARKER_KEY, objects.MAX_MARKER_BYTES), store.url)


def _push_one(path: Path, store: Store, name: str | None, jobs: int, progress: ProgressFn | None,
              repair: bool) -> PushResult:
    with ContainerReader(path) as reader, open(path, "rb", buffering=0) as raw:
        read = _reader_of(raw, path)
        blob_members = sorted((m for n, m in reader.members.items() if layout.is_blob_name(n) and m.frames),
                              key=lambda m: m.offset)
        digest, blob_sha, missing, uploaded, raced, found = _hashed_while_uploading(
            reader, read, store, blob_members, jobs, progress, path)
        if raced:
            _settle_races(store, raced, found, blob_sha, jobs)
        segments = _segments(reader, read, blob_members, blob_sha)

        repaired = _repair_blobs(reader, read, store, segments, found, blob_sha, repair, jobs, progress, path)
        uploaded += sum(s.size for s in repaired)
        segments, variants, sent = _conflicts_to_variants(reader, read, store, segments, found, jobs, progress, path)
        uploaded += sent
        missing += variants

        archive = ArchiveObject(digest, reader.file_size, reader.index_digest, tuple(segments))
        data = archive.to_bytes()
        key = objects.archive_key(digest)
        there = store.size(key)
        if there != len(data) or (repair and store.read_small(key, objects.MAX_ARCHIVE_OBJECT_BYTES) != data):
            store.write(key, data)
            uploaded += len(data)

        ref_name, previous, ref_size = _write_ref(store, reader, path, name, digest)
        uploaded += ref_size
        return PushResult(path, store.url, ref_name, digest, reader.file_size, len(blob_members), len(missing),
                          uploaded, previous if previous not in (None, digest) else None, reader.index_digest,
                          tuple(s.key for s in repaired))


def _hashed_while_uploading(reader: ContainerReader, read, store: Store, blob_members: list, jobs: int,
                            progress: ProgressFn | None, path: Path) -> tuple:
    """(digest, blob_sha, missing, uploaded, raced, found): the lookups and the uploads of what is
    missing run while the file is hashed, since the archive's digest and the frames' sha256 are
    needed only for its archive object."""
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="reproarchive-lookup") as background:
        found_later = background.submit(store.sizes, [m.name for m in blob_members], jobs=jobs)

        def upload_missing():
            found = found_later.result()
            todo = [BlobSegment(m.name, m.name, m.compressed, "") for m in blob_members if found[m.name] is None]
            sent, raced = _upload_blobs(reader, read, store, todo, jobs, progress, path, stop)
            return [s for s in todo if s not in raced], sent, raced

        uploading = background.submit(upload_missing)
        try:
            digest, blob_sha = _hash_file(read, reader.file_size, blob_members, progress)
        except BaseException:
            stop.set()  # uploads in flight are dropped (never committed), none is started
            raise
        missing, uploaded, raced = uploading.result()
        found = found_later.result()
    return digest, blob_sha, missing, uploaded, raced, found


def _settle_races(store: Store, raced: list, found: dict, blob_sha: dict[str, str], jobs: int) -> None:
    """Another push created a blob between our lookup and our upload: its frames count as
    found, like a blob that was there before, unless they are not ours (§11.2)."""
    found.update(store.sizes([s.key for s in raced], jobs=jobs))
    for seg in raced:
        if found[seg.key] == seg.size and not _same_frames(store, seg, blob_sha[seg.blob]):
            found[seg.key] = -1  # taken by other frames of the same size: ours go to a variant


def _segments(reader: ContainerReader, read, blob_members: list, blob_sha: dict[str, str]) -> list:
    """The file as the archive object lists it: the bytes between blobs inline, each blob by key."""
    segments: list = []
    cursor = 0
    for m in blob_members:
        if m.offset > cursor:
            segments.append(read(cursor, m.offset - cursor))
        segments.append(BlobSegment(m.name, m.name, m.compressed, blob_sha[m.name]))
        cursor = m.offset + m.compressed
    segments.append(read(cursor, reader.file_size - cursor))
    return segments


def _conflicts_to_variants(reader: ContainerReader, read, store: Store, segments: list, found: dict, jobs: int,
                           progress: ProgressFn | None, path: Path) -> tuple[list, list, int]:
    """(segments, variants uploaded, bytes sent): a key holding other frames of the same blob
    (another level, frame size or zstd) gets our frames under a variant key (spec §11.2)."""
    conflicts = [s for s in segments if isinstance(s, BlobSegment) and found[s.key] not in (None, s.size)]
    if not conflicts:
        return segments, [], 0
    moved = {s.blob: dataclasses.replace(s, key=objects.variant_key(s.blob, s.sha256)) for s in conflicts}
    segments = [moved.get(s.blob, s) if isinstance(s, BlobSegment) else s for s in segments]
    there = store.sizes([s.key for s in moved.values()], jobs=jobs)
    variants = [s for s in moved.values() if there[s.key] != s.size]
    return segments, variants, _upload_blobs(reader, read, store, variants, jobs, progress, path)[0]


def _write_ref(store: Store, reader: ContainerReader, path: Path, name: str | None,
               digest: str) -> tuple[str, str | None, int]:
    """(name, the archive it named before or "unreadable", bytes written): the result says what
    a push replaced, so a teammate's ref is never overwritten silently."""
    ref_name = name or default_name(path, digest)
    ref = Ref(ref_name, digest, reader.file_size, _now(),
              summary(reader.index, reader.file_size, reader.index_digest))
    previous = None
    old = store.size(objects.ref_key(ref_name))
    if old is not None:
        try:
            raw_ref = store.read_small(objects.ref_key(ref_name), objects.MAX_REF_BYTES)
            previous = objects.decode_ref(ref_name, raw_ref).archive
        except Exception:  # noqa: BLE001 - a damaged ref is simply replaced
            previous = "unreadable"
    ref_bytes = ref.to_bytes()
    store.write(objects.ref_key(ref_name), ref_bytes)
    return ref_name, previous, len(ref_bytes)


def _hash_file(read, total: int, blob_members, progress) -> tuple[str, dict[str, str]]:
    """The archive's sha256 and each blob's frames' sha256, in one read of the file."""
    whole = hashlib.sha256()
    starts = {m.offset: m for m in blob_members}
    bounds = sorted({0, total, *starts, *(m.offset + m.compressed for m in blob_members)})
    out: dict[str, str] = {}
    done = 0
    for a, b in itertools.pairwise(bounds):
        member = starts.get(a)
        h = hashlib.sha256() if member is not None else None
        for pos in range(a, b, CHUNK_BYTES):
            chunk = read(pos, min(CHUNK_BYTES, b - pos))
            whole.update(chunk)
            if h is not None:
                h.update(chunk)
            done += len(chunk)
            if progress:
                progress("hash", done, total)
        if member is not None:
            out[member.name] = h.hexdigest()
    return "sha256:" + whole.hexdigest(), out


def _repair_blobs(reader: ContainerReader, read, store: Store, segments: list, found: dict, blob_sha: dict,
                  repair: bool, jobs: int, progress, path: Path) -> list[BlobSegment]:
    """Replace the blob objects the store holds with the right size but the wrong frames: those
    a check recorded as damaged, or (``repair``) every one this archive would reuse. Read back
    only those; everything else stays trusted by size, which is what keeps pushes cheap."""
    marked = objects.damaged_keys(store)
    suspects = [s for s in segments if isinstance(s, BlobSegment) and found.get(s.key) == s.size
                and (repair or s.key in marked)]
    bad: list[BlobSegment] = []
    lock = threading.Lock()

    def look(seg: BlobSegment) -> None:
        if not _same_frames(store, seg, blob_sha[seg.blob]):
            with lock:
                bad.append(dataclasses.replace(seg, sha256=blob_sha[seg.blob]))

    run_all(look, suspects, jobs=jobs, name="reproarchive-recheck")
    _upload_blobs(reader, read, store, bad, jobs, progress, path, exclusive=False)
    if store.supports_delete:
        for seg in suspects:
            if seg.key in marked:
                store.delete(objects.damage_key(seg.key))  # replaced, or found good again: the record is done
    return sorted(bad, key=lambda s: s.key)


def _upload_blobs(reader: ContainerReader, read, store: Store, missing: list[BlobSegment], jobs: int, progress,
                  path: Path, stop: threading.Event | None = None, *,
                  exclusive: bool = True) -> tuple[int, list[BlobSegment]]:
    """Upload the missing blob objects in parallel, each checked against its name first and
    created only if the key is still free (``exclusive``; a repair replaces what is there).
    Returns the bytes sent and the blobs whose key another writer took in the meantime
    (nothing of ours is written there)."""
    if not missing:
        return 0, []
    raced: list[BlobSegment] = []
    total = sum(s.size for s in missing)
    lock = threading.Lock()
    done = [0]

    def advance(n: int) -> None:
        with lock:
            done[0] += n
            if progress:
                progress("push", done[0], total)

    def one(seg: BlobSegment) -> None:
        if stop is not None and stop.is_set():
            raise _Stopped()
        member = reader.member(seg.blob)
        check = BlobCheck(seg, member.size, content=True, stored=False,
                          hint=f"{path} is damaged: nothing of it is named in the store; `reproarchive verify` it")
        for pos in range(member.offset, member.offset + seg.size, CHUNK_BYTES):
            check.update(read(pos, min(CHUNK_BYTES, member.offset + seg.size - pos)))
        check.finish()  # the archive is damaged: nothing goes under this blob's name

        def chunks():
            for pos in range(member.offset, member.offset + seg.size, CHUNK_BYTES):
                if stop is not None and stop.is_set():
                    raise _Stopped()
                yield read(pos, min(CHUNK_BYTES, member.offset + seg.size - pos))

        if not store.write_stream(seg.key, seg.size, chunks(), on_chunk=advance, exclusive=exclusive):
            with lock:
                raced.append(seg)

    run_all(one, missing, jobs=jobs, name="reproarchive-push")
    return total - sum(s.size for s in raced), raced


def _same_frames(store: Store, seg: BlobSegment, sha256_hex: str) -> bool:
    """Whether the object another push just created under ``seg.key`` holds our frames (read
    back only after a lost race, which is rare)."""
    h = hashlib.sha256()
    for chunk in store.iter_object(seg.key, seg.size):
        h.update(chunk)
    return h.hexdigest() == sha256_hex


class _Stopped(Exception):
    """The push failed elsewhere: an upload still running gives up (and is never committed)."""


def _reader_of(raw, path: Path):
    fd = raw.fileno()

    def read(offset: int, n: int) -> bytes:
        data = os.pread(fd, n, offset)
        if len(data) != n:
            raise TruncatedArchiveError(f"{path} changed while being pushed", "push it again")
        return data

    return read


def summary(index: Index, file_size: int, index_digest: str | None = None) -> RefSummary:
    """What ``ls`` shows about an archive, kept in its ref so listing reads refs only."""
    kinds = {"real": 0, "absent": 0, "values": 0}
    for value in index.inputs:
        if isinstance(value, TensorValue):
            kinds["real" if index.storages[value.storage].is_real else "absent"] += 1
        else:
            kinds["values"] += 1
    failure = index.records.failure
    message = (failure.message or "").strip().splitlines() if failure else []
    return RefSummary(
        failure=None if failure is None else RefFailure(
            failure.signature, failure.stage, failure.exception_type, message[0][:200] if message else None),
        backend=index.records.backend or (failure.backend if failure else None),
        ops=index.graph.op_count(),
        inputs_real=kinds["real"], inputs_absent=kinds["absent"], inputs_values=kinds["values"],
        bytes_logical=sum(s.size for s in index.storages if s.is_real),
        file_bytes=file_size,
        torch=index.records.created_by.torch if index.records.created_by else None,
        source=index.records.source.kind if index.records.source else None,
        index_digest=index_digest,
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

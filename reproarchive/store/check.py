"""``fsck``: rehash what a store holds, because a push trusts what it finds there.

A push reuses a blob object it finds under the blob's name with the right size, and that is
what makes pushes cheap. It also means that a blob damaged in place (a bad disk, a tool that
rewrote an object, a hostile writer) stays damaged, and every archive that shares it fails to
pull. This module is the other half of that bargain: it rehashes blob objects (all of them, a
random sample, or the ones a failed pull named), against the digest in their name and against
the frames' sha256 that every archive object using them recorded, names the archives each
damaged blob breaks, and records the damage in the store (``damaged/<alg>/<hex>``, spec
§11.1) so that the next push holding a good copy of the blob replaces it, with no flag needed.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import random
import threading
from collections.abc import Iterable

from reproarchive.errors import ArchiveError, CorruptStoreError, StoreNotFoundError
from reproarchive.format.parallel import run_all
from reproarchive.progress import ProgressFn
from reproarchive.store import objects
from reproarchive.store.backend import Store
from reproarchive.store.objects import BlobCheck, BlobSegment, damage_key
from reproarchive.store.pull import open_store


@dataclasses.dataclass(frozen=True)
class DamagedBlob:
    """One blob object that is not what its name and its archives say."""

    key: str  # the object: ``blobs/<alg>/<hex>`` or a variant of it
    blob: str  # the blob member it holds
    reason: str
    archives: tuple[str, ...]  # refs (or, unnamed, archive digests) whose pull it breaks
    found_sha256: str | None  # sha256 of the object's bytes as found (None: unreadable)

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"archives": list(self.archives)}


@dataclasses.dataclass
class StoreCheck:
    """What ``fsck`` found: how much it read, and every damaged blob object."""

    COMPUTED = ("ok",)

    store: str
    blobs_total: int
    blobs_checked: int
    bytes_checked: int
    archives_read: int
    sampled: bool
    damaged: list[DamagedBlob]
    marked: int  # damage records written (0 when marking was off or the store is read-only)

    @property
    def ok(self) -> bool:
        return not self.damaged

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "ok": self.ok, "damaged": [d.to_json() for d in self.damaged]}


def check_store(url: str | os.PathLike, *, sample: int | None = None, blobs: Iterable[str] = (),
                seed: int | None = None, mark: bool = True, jobs: int = 8, progress: ProgressFn | None = None,
                storage_options: dict | None = None) -> StoreCheck:
    """Rehash the blob objects of the store at ``url``: every one (default), ``sample`` of them
    chosen at random, or the ``blobs`` named (a blob name, an object key or its hex digest, as a
    failed pull prints them). Damage is recorded in the store when ``mark`` (and it can write)."""
    store = open_store(url, storage_options)
    every = _blob_objects(store)
    wanted = list(blobs)
    if wanted:
        chosen = [_resolve(every, name, store.url) for name in wanted]
    elif sample is not None and sample < len(every):
        chosen = sorted(random.Random(seed).sample(sorted(every), sample))
    else:
        chosen = sorted(every)
    users = _users(store, jobs)
    damaged: list[DamagedBlob] = []
    lock = threading.Lock()
    done = [0, 0]
    total = sum(every[k] for k in chosen)

    def one(key: str) -> None:
        reason, found = _rehash(store, key, every[key], users.recorded.get(key, {}))
        with lock:
            done[0] += 1
            done[1] += every[key]
            if progress:
                progress("check", done[1], total)
            if reason is not None:
                damaged.append(DamagedBlob(key, objects.blob_of(key), reason, users.names(key), found))

    run_all(one, chosen, jobs=jobs, name="reproarchive-check")
    damaged.sort(key=lambda d: d.key)
    marked = 0
    if mark and damaged and store.supports_writes:
        for d in damaged:
            store.write(damage_key(d.key), _damage_bytes(d))
            marked += 1
    return StoreCheck(store.url, len(every), len(chosen), done[1], users.archives_read, len(chosen) < len(every),
                      damaged, marked)


# --------------------------------------------------------------------------------------------


def _blob_objects(store: Store) -> dict[str, int]:
    keys = [k for k in store.list("blobs/sha256") if objects.blob_of(k) is not None]
    sizes = store.sizes(keys)
    return {k: s for k, s in sizes.items() if s is not None}


def _resolve(every: dict[str, int], name: str, url: str) -> str:
    name = name.strip().removeprefix("object ").removeprefix("sha256:")
    if name in every:
        return name
    if f"blobs/sha256/{name}" in every:
        return f"blobs/sha256/{name}"
    matches = sorted(k for k in every if k.rsplit("/", 1)[1].startswith(name.rsplit("/", 1)[-1]))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise StoreNotFoundError(f"{url} holds no blob object {name!r}",
                                 "give a key as `pull` printed it (blobs/sha256/<hex>), or omit it to check all")
    raise StoreNotFoundError(f"{name!r} is the start of {len(matches)} blob objects in {url}", "give more digits")


@dataclasses.dataclass
class _Users:
    """Who uses each blob object: what every archive object recorded for it, and the refs
    naming each archive (a damaged blob is reported by the names a user knows)."""

    recorded: dict[str, dict[str, tuple[int, str]]]  # blob key -> {archive digest: (size, frames sha256)}
    refs: dict[str, list[str]]  # archive digest -> ref names
    archives_read: int

    def names(self, key: str) -> tuple[str, ...]:
        return tuple(sorted({n for digest in self.recorded.get(key, {}) for n in self.refs.get(digest, [digest])}))


def _users(store: Store, jobs: int) -> _Users:
    """Read every archive object and ref. A damaged archive object is skipped here: pulling it
    fails on its own, naming itself."""
    keys = [k for k in store.list("archives/sha256") if objects.SHA256_RE.match("sha256:" + k.rsplit("/", 1)[1])]
    recorded: dict[str, dict[str, tuple[int, str]]] = {}
    lock = threading.Lock()

    def one(key: str) -> None:
        digest = "sha256:" + key.rsplit("/", 1)[1]
        try:
            archive = objects.decode_archive_object(digest, store.read_small(key, objects.MAX_ARCHIVE_OBJECT_BYTES))
        except (ArchiveError, StoreNotFoundError):
            return
        with lock:
            for seg in archive.blobs():
                recorded.setdefault(seg.key, {})[digest] = (seg.size, seg.sha256)

    run_all(one, keys, jobs=jobs, name="reproarchive-check-archives")
    return _Users(recorded, _ref_names(store), len(keys))


def _ref_names(store: Store) -> dict[str, list[str]]:
    keys = [k for k in store.list("refs") if objects.NAME_RE.match(k.rsplit("/", 1)[1])]
    out: dict[str, list[str]] = {}
    for key, data in store.read_many(keys).items():
        if isinstance(data, bytes):
            try:
                ref = objects.decode_ref(key.rsplit("/", 1)[1], data)
            except ArchiveError:
                continue
            out.setdefault(ref.archive, []).append(ref.name)
    return out


def _rehash(store: Store, key: str, size: int, recorded: dict[str, tuple[int, str]]) -> tuple[str | None, str | None]:
    """Why the object under ``key`` is damaged (None: it is not), and the sha256 of its bytes."""
    blob = objects.blob_of(key)
    check = BlobCheck(BlobSegment(blob, key, size, ""), content=True, stored=False)
    frames = hashlib.sha256()
    try:
        for chunk in store.iter_object(key, size):
            frames.update(chunk)
            check.update(chunk)
        check.finish()
    except CorruptStoreError as exc:
        return exc.what.split(") ", 1)[-1], frames.hexdigest()
    except StoreNotFoundError:
        return "disappeared while being checked", None
    found = frames.hexdigest()
    for digest, (want_size, want_sha) in sorted(recorded.items()):
        if (want_size, want_sha) != (size, found):
            return (f"holds {size} bytes of frames with sha256 {found[:16]}..., but archive {digest[:19]}... "
                    f"recorded {want_size} bytes with sha256 {want_sha[:16]}..."), found
    return None, found


def _damage_bytes(d: DamagedBlob) -> bytes:
    plain = {"format": objects.DAMAGE_FORMAT, "key": d.key, "reason": d.reason[:500], "found_sha256": d.found_sha256,
             "checked": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return (json.dumps(plain, sort_keys=True) + "\n").encode()

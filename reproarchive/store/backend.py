"""What a store backend must do: the ``Store`` interface that ``push``, ``pull`` and ``ls`` use.

A store is a flat set of objects named by keys (``blobs/sha256/<hex>``, ``refs/<name>``; spec
§11.1). ``push``, ``pull`` and ``ls`` need very little from it, so the abstract core is five
primitives: the size of an object, a byte range of it, a whole-object write, a write that
only creates, and the keys under a prefix. Everything else (batched lookups, bounded reads,
chunked reads, streamed writes) has a default built on those primitives, which a backend
overrides only to go faster (fsspec's batched ``cat``, S3 multipart uploads).

Capability flags say what a backend can promise, and the layers above rely on nothing else:

* ``supports_writes``: ``write``/``create``/``write_stream``/``delete`` work (a read-only
  mirror says no, and each raises ``StoreError``; ``push`` then refuses before uploading
  anything);
* ``supports_listing``: ``list`` works (without it a store is reached by names only and
  ``list`` raises ``StoreError``: ``pull STORE/NAME`` works, ``ls`` and digest prefixes do not);
* ``supports_delete``: ``delete`` works (without it ``delete`` raises ``StoreError``, the
  default). Only damage records (``damaged/...``) are ever deleted, once a push has replaced
  the blob they name; without it they stay, and cost the next push of that blob one read;
* ``atomic_create``: ``create`` is one atomic step (an S3 conditional PUT, a hard link in a
  folder), so two writers racing for one key cannot both win. Without it ``create`` is a
  lookup then a write, and two pushes that race with *different* frames for one blob may
  leave one archive naming frames that were replaced (its pull then fails naming the blob).

Every backend keeps these promises, and ``reproarchive.testing.stores.StoreTests`` checks
them (a capability a backend does not claim is checked to be refused): an object appears
whole or not at all; ``size`` of a missing key is ``None``; a read of a missing key raises
``StoreNotFoundError``; every other failure of the backend is one ``StoreError`` line saying
what failed where; ``refresh`` forgets anything cached, since other processes write to the
same store.

Adding a backend (say, a key-value service with no fsspec filesystem):

1. Subclass ``Store`` in a module of its own and implement ``size``, ``read_range``, ``write``,
   ``create`` and ``list``; set the capability flags to what it really does; set ``url``.
2. Map its errors: a missing object is ``StoreNotFoundError``, anything else ``StoreError``
   (``reproarchive.store.location.backend_errors`` does this for exceptions of any type).
3. Override a bulk method (``sizes``, ``read_many``, ``write_stream``) only where the service
   has a faster way; the defaults are correct.
4. Subclass ``reproarchive.testing.stores.StoreTests`` in the tests, with a ``store`` that
   opens an empty store and a side door (``side_put``/``side_get``) that goes around the class
   under test; every test must pass (none is skipped: a capability that is off is checked to
   be refused).
5. Teach ``location.open_location`` its URL scheme.
"""

from __future__ import annotations

import abc
import concurrent.futures
from collections.abc import Callable, Iterable, Iterator

from reproarchive.errors import CorruptStoreError, LimitExceededError, StoreError, StoreNotFoundError

# Above this an object is streamed (multipart on S3), below it sent in one request.
STREAM_BYTES = 64 << 20
CHUNK_BYTES = 16 << 20


class Store(abc.ABC):
    """A store root; keys are relative paths under it (spec §11.1)."""

    url: str
    supports_writes: bool = True
    supports_listing: bool = True
    supports_delete: bool = False
    atomic_create: bool = False
    stream_bytes: int = STREAM_BYTES  # objects larger than this go through ``write_stream``'s streaming path

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- the abstract core
    @abc.abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size in bytes, or None when there is none."""

    @abc.abstractmethod
    def read_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` up to ``end`` (fewer when the object ends first); a missing object
        raises ``StoreNotFoundError``."""

    @abc.abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Put a whole object, replacing any; readers see the old object or the new one, whole."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> bool:
        """Put a whole object only if ``key`` holds none; False (and nothing written) if it does.
        Atomic when ``atomic_create`` says so."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Keys directly under ``prefix`` (a folder of the layout), relative to the root; [] when
        there are none."""

    # -- optional
    def delete(self, key: str) -> None:
        """Remove an object; a missing one is not an error. Only where ``supports_delete``."""
        raise StoreError(f"{self.url} cannot delete objects", "leave the object; nothing depends on its removal")

    # -- defaults built on the core
    def refresh(self) -> None:  # noqa: B027 - a default: a store that caches nothing has nothing to forget
        """Forget cached listings and sizes (other processes push to the same store)."""

    def missing_root(self) -> str | None:
        """What is missing when the place the store lives in does not exist (a bucket), said as
        a sentence; None when it exists or is created on demand (a folder). Asked only after
        the store's marker was not found, to tell "no bucket" from "no store in the bucket"."""
        return None

    def check_writable(self) -> None:
        if not self.supports_writes:
            raise StoreError(f"{self.url} is read-only", "push to a store this backend can write to")

    def sizes(self, keys: Iterable[str], *, jobs: int = 16) -> dict[str, int | None]:
        """Sizes of many objects (None: absent), looked up concurrently."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        with concurrent.futures.ThreadPoolExecutor(min(jobs, len(keys)),
                                                   thread_name_prefix="reproarchive-size") as pool:
            return dict(zip(keys, pool.map(self.size, keys)))

    def read_small(self, key: str, cap: int) -> bytes:
        """A whole object known to be small; refused unread when its size is over ``cap``."""
        size = self.size(key)
        if size is None:
            raise StoreNotFoundError(f"{self.url}/{key} does not exist")
        if size > cap:
            raise LimitExceededError(f"{self.url}/{key} is {size} bytes, more than the {cap} allowed",
                                     "the store is damaged or hostile")
        data = self.read_range(key, 0, cap + 1)
        if len(data) != size:
            raise CorruptStoreError(f"{self.url}/{key} changed size while being read ({size} -> {len(data)} bytes)",
                                    "retry; if it persists the store is damaged")
        return data

    def read_many(self, keys: list[str]) -> dict[str, bytes | BaseException]:
        """Several small objects (refs) at once: each key's bytes, or the error reading it."""
        def one(key: str):
            try:
                return self.read_range(key, 0, 1 << 62)
            except StoreError as exc:
                return exc

        if not keys:
            return {}
        with concurrent.futures.ThreadPoolExecutor(min(16, len(keys)), thread_name_prefix="reproarchive-read") as pool:
            return dict(zip(keys, pool.map(one, keys)))

    def iter_object(self, key: str, size: int, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
        """An object's bytes in ranged reads, never past ``size`` + 1 (a longer object is caught
        by its checker without reading the rest)."""
        start = 0
        while start <= size:
            end = min(start + chunk, size + 1)
            data = self.read_range(key, start, end)
            if not data:
                return
            yield data
            if len(data) < end - start:  # the object ended
                return
            start += len(data)

    def write_stream(self, key: str, size: int, chunks: Iterable, *, on_chunk: Callable[[int], None] | None = None,
                     exclusive: bool = False) -> bool:
        """Put an object of ``size`` bytes from ``chunks``; with ``exclusive``, only if ``key``
        holds none (False: nothing written). A failure part way writes nothing. The default
        joins the chunks in memory; backends that can stream override it."""
        self.check_writable()  # before reading the chunks: a read-only store refuses unread
        data = b"".join(bytes(c) for c in chunks)
        if exclusive:
            written = self.create(key, data)
        else:
            self.write(key, data)
            written = True
        if on_chunk:
            on_chunk(len(data))
        return written

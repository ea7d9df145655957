"""Where a store is, and the few operations on it that push, pull and ls need.

A store is any fsspec URL: ``s3://bucket/prefix``, ``gs://…``, ``az://…``, ``memory://…``,
``file:///path``, or a plain local folder. fsspec comes with torch, so local and memory stores
need no extra; S3 needs ``s3fs`` (``pip install reproarchive[store]``), GCS ``gcsfs``, Azure
``adlfs``. Credentials and endpoints are the backend's own (``AWS_PROFILE``,
``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS`` …): reproarchive never handles them.

What this module guarantees to the layers above:

* an object appears whole or not at all: object stores give that for a PUT; local folders
  get a temporary name and a rename, and a streamed upload that fails is discarded, never
  committed;
* every error of the backend becomes one ``StoreError`` line saying what failed where;
* reads are bounded: a small object (marker, ref, archive object) is read only after its
  size is known to be under its cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator

from reproarchive.errors import CorruptStoreError, LimitExceededError, ReproArchiveError, StoreError, StoreNotFoundError
from reproarchive.format.atomic import atomic_file
from reproarchive.store import objects

_URL_RE = re.compile(r"^([a-z][a-z0-9+.-]*)://")
# Above this an object is streamed (multipart on S3), below it sent in one request.
STREAM_BYTES = 64 << 20
CHUNK_BYTES = 16 << 20
_EXTRAS = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs"}


def has_scheme(text: str) -> bool:
    return bool(_URL_RE.match(str(text)))


def is_local_store(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / objects.MARKER_KEY).is_file()


def is_reference(text: str | os.PathLike) -> bool:
    """Whether ``text`` names an archive in a store rather than a file: a URL, or a path whose
    folder is a local store. An existing file is always a file."""
    text = os.fspath(text)
    if has_scheme(text) and not text.startswith("file://"):
        return True
    path = Path(text[len("file://"):] if text.startswith("file://") else text)
    if path.is_file():
        return False
    return text.startswith("file://") or is_local_store(path.parent)


is_store_reference = is_reference


def is_store(text: str | os.PathLike) -> bool:
    """Whether ``text`` is a store location: a URL of a remote filesystem, or a local folder
    holding a store marker (``ls`` tells a store from a trace log by this)."""
    text = os.fspath(text)
    if has_scheme(text) and not text.startswith("file://"):
        return True
    return is_local_store(text[len("file://"):] if text.startswith("file://") else text)


def split_reference(text: str) -> tuple[str, str]:
    """``STORE/NAME`` -> (STORE, NAME): the last path segment names the archive."""
    text = os.fspath(text).rstrip("/")
    store, sep, name = text.rpartition("/")
    if not sep or not name or store.endswith(":/") or store.endswith(":"):
        raise StoreNotFoundError(f"{text!r} names no archive in a store", "write STORE/NAME or STORE/DIGEST-PREFIX, e.g. s3://team/repros/resnet-3fa2b1c0")
    return store, name


class Store:
    """A store root on some filesystem; keys are relative paths under it (spec §11.1)."""

    def __init__(self, url: str | os.PathLike, **storage_options):
        self.url = os.fspath(url).rstrip("/") or "/"
        protocol = (_URL_RE.match(self.url).group(1) if has_scheme(self.url) else "file")
        try:
            import fsspec
        except ImportError:  # pragma: no cover - torch depends on fsspec
            raise StoreError("fsspec is not installed", "pip install 'reproarchive[store]'") from None
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **storage_options)
        except ImportError as exc:
            package = _EXTRAS.get(protocol, f"the fsspec backend for {protocol}://")
            raise StoreError(f"{protocol}:// stores need {package}, which is not installed",
                             f"pip install 'reproarchive[store]' (S3) or pip install {package}") from exc
        except ValueError as exc:
            raise StoreError(f"{self.url} is not a store location fsspec understands: {exc}") from None
        self.root = root.rstrip("/")
        self.local = "file" in _protocols(self.fs)
        self.async_impl = bool(getattr(self.fs, "async_impl", False))

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    # -- errors
    @contextlib.contextmanager
    def _errors(self, doing: str, key: str | None = None) -> Iterator[None]:
        where = f"{self.url}/{key}" if key else self.url
        try:
            yield
        except ReproArchiveError:
            raise
        except FileNotFoundError:
            raise StoreNotFoundError(f"{where} does not exist") from None
        except PermissionError as exc:
            raise StoreError(f"{doing} {where}: permission denied ({_short(exc)})", "check the store's credentials and permissions") from None
        except (OSError, RuntimeError, ValueError, asyncio.TimeoutError) as exc:
            raise StoreError(f"{doing} {where} failed: {_short(exc)}", "check that the store is reachable and retry") from None
        except Exception as exc:  # backends raise their own types (botocore, aiohttp, azure)
            raise StoreError(f"{doing} {where} failed: {type(exc).__name__}: {_short(exc)}",
                             "check that the store is reachable and retry") from None

    def refresh(self) -> None:
        """Forget cached listings: other processes push to the same store."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache()

    # -- reading
    def size(self, key: str) -> int | None:
        """The object's size, or None when there is none (one request)."""
        with self._errors("looking up", key):
            try:
                info = self.fs.info(self.path(key))
            except FileNotFoundError:
                return None
            return _object_size(info)

    def sizes(self, keys: Iterable[str], *, jobs: int = 16) -> dict[str, int | None]:
        """Sizes of many objects in one batch of concurrent lookups (None: absent)."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return {}
        with self._errors("looking up blobs in"):
            if self.async_impl:
                from fsspec.asyn import _run_coros_in_chunks, sync

                async def one(key):
                    try:
                        return _object_size(await self.fs._info(self.path(key)))
                    except FileNotFoundError:
                        return None

                async def batch():
                    return await _run_coros_in_chunks([one(k) for k in keys], batch_size=jobs * 4, return_exceptions=True)

                found = sync(self.fs.loop, batch)
            else:
                import concurrent.futures

                def one_sync(key):
                    try:
                        return _object_size(self.fs.info(self.path(key)))
                    except FileNotFoundError:
                        return None
                    except Exception as exc:  # noqa: BLE001 - reported below like the async path
                        return exc

                with concurrent.futures.ThreadPoolExecutor(min(jobs, len(keys))) as pool:
                    found = list(pool.map(one_sync, keys))
        for key, value in zip(keys, found):
            if isinstance(value, BaseException):
                with self._errors("looking up", key):
                    raise value
        return dict(zip(keys, found))

    def read_small(self, key: str, cap: int) -> bytes:
        """A whole object known to be small; refused unread when its size is over ``cap``."""
        with self._errors("reading", key):
            size = _object_size(self.fs.info(self.path(key)))
            if size is None or size > cap:
                raise LimitExceededError(f"{self.url}/{key} is {size} bytes, more than the {cap} allowed",
                                         "the store is damaged or hostile")
            data = self.fs.cat_file(self.path(key), start=0, end=cap + 1)
        if len(data) != size:
            raise CorruptStoreError(f"{self.url}/{key} changed size while being read ({size} -> {len(data)} bytes)",
                                    "retry; if it persists the store is damaged")
        return data

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with self._errors("reading", key):
            return self.fs.cat_file(self.path(key), start=start, end=end)

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

    def list(self, prefix: str) -> list[str]:
        """Keys directly under ``prefix`` (a folder of the layout), relative to the root."""
        with self._errors("listing", prefix):
            try:
                entries = self.fs.ls(self.path(prefix), detail=False)
            except FileNotFoundError:
                return []
        base = self.path(prefix).rstrip("/") + "/"
        out = []
        for entry in entries:
            entry = str(entry).rstrip("/")
            if entry.startswith(base):
                out.append(f"{prefix.rstrip('/')}/{entry[len(base):]}")
            elif entry.startswith("/" + base):  # memory:// answers with a leading slash
                out.append(f"{prefix.rstrip('/')}/{entry[len(base) + 1:]}")
        return out

    def read_many(self, keys: list[str]) -> dict[str, bytes | BaseException]:
        """Several small objects in one batch (fsspec's ``cat`` runs them concurrently)."""
        if not keys:
            return {}
        paths = {self.path(k): k for k in keys}
        with self._errors("reading", keys[0].rpartition("/")[0]):
            got = self.fs.cat(list(paths), on_error="return")
        if not isinstance(got, dict):  # a single path comes back as bytes
            got = {next(iter(paths)): got}
        return {paths.get(p, p.lstrip("/")): v for p, v in got.items() if paths.get(p, p.lstrip("/")) in keys}

    # -- writing
    def write(self, key: str, data: bytes) -> None:
        """Put a whole object at once (atomic: a PUT, or a rename for a local folder)."""
        with self._errors("writing", key):
            if self.local:
                with atomic_file(self.path(key)) as f:
                    f.write(data)
            else:
                self.fs.pipe_file(self.path(key), data)

    def write_stream(self, key: str, size: int, chunks: Iterable, *, on_chunk: Callable[[int], None] | None = None) -> None:
        """Put an object of ``size`` bytes from ``chunks`` without holding it in memory.

        Small objects are joined and sent in one request; larger ones are streamed (multipart
        on S3) and, if anything fails, discarded rather than committed half-written.
        """
        if size <= STREAM_BYTES:
            data = b"".join(bytes(c) for c in chunks)
            self.write(key, data)
            if on_chunk:
                on_chunk(len(data))
            return
        with self._errors("writing", key):
            if self.local:
                with atomic_file(self.path(key)) as f:
                    for c in chunks:
                        f.write(c)
                        if on_chunk:
                            on_chunk(len(c))
                return
            f = self.fs.open(self.path(key), "wb", block_size=max(CHUNK_BYTES, 5 << 20))
            try:
                for c in chunks:
                    f.write(c)
                    if on_chunk:
                        on_chunk(len(c))
            except BaseException:
                # never close() it: fsspec's close commits what was written so far
                discard = getattr(f, "discard", None)
                if discard is not None:
                    with contextlib.suppress(Exception):
                        discard()
                f.closed = True  # and its finaliser must not try either
                raise
            f.close()


def _object_size(info: dict) -> int | None:
    if info.get("type") == "directory":
        return None
    size = info.get("size", info.get("Size"))
    return int(size) if isinstance(size, int) else None


def _protocols(fs) -> tuple:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:240]

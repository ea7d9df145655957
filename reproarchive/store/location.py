"""Where a store is, and ``FsspecStore``: the ``Store`` interface (``backend``) on fsspec.

A store is any fsspec URL: ``s3://bucket/prefix``, ``gs://…``, ``az://…``, ``memory://…``,
``file:///path``, or a plain local folder. fsspec comes with torch, so local and memory stores
need no extra; S3 needs ``s3fs`` (``pip install reproarchive[store]``), GCS ``gcsfs``, Azure
``adlfs``. Credentials and endpoints are the backend's own (``AWS_PROFILE``,
``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS`` …): reproarchive never handles them.

What this module guarantees to the layers above (the promises of ``backend.Store``):

* an object appears whole or not at all: object stores give that for a PUT; local folders
  get a temporary name and a rename, and a streamed upload that fails is discarded, never
  committed;
* ``create`` is atomic on S3 (a PUT with ``If-None-Match: *``), in a folder (a hard link)
  and in memory (a lock); on other filesystems it is a lookup then a write;
* every error of the backend becomes one ``StoreError`` line saying what failed where;
* reads are bounded: a small object (marker, ref, archive object) is read only after its
  size is known to be under its cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from reproarchive.errors import ReproArchiveError, StoreError, StoreNotFoundError, StoreURLError
from reproarchive.format.atomic import atomic_file
from reproarchive.store import objects
from reproarchive.store.backend import CHUNK_BYTES, Store

__all__ = ["FsspecStore", "backend_errors", "open_location"]

_URL_RE = re.compile(r"^([a-z][a-z0-9+.-]*)://")
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
    path = Path(text.removeprefix("file://"))
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
    return is_local_store(text.removeprefix("file://"))


def split_reference(text: str) -> tuple[str, str]:
    """``STORE/NAME`` -> (STORE, NAME): the last path segment names the archive."""
    text = os.fspath(text).rstrip("/")
    store, sep, name = text.rpartition("/")
    if not sep or not name or store.endswith((":/", ":")):
        raise StoreNotFoundError(f"{text!r} names no archive in a store",
                                 "write STORE/NAME or STORE/DIGEST-PREFIX, e.g. s3://team/repros/resnet-3fa2b1c0")
    return store, name


def open_location(url: str | os.PathLike, **storage_options) -> Store:
    """The store at ``url``: every scheme goes through fsspec today; a backend of another kind
    is chosen here by its scheme (see ``reproarchive.store.backend``)."""
    return url if isinstance(url, Store) else FsspecStore(url, **storage_options)


@contextlib.contextmanager
def backend_errors(doing: str, where: str) -> Iterator[None]:
    """Any backend's exception as one of ours: a missing object is ``StoreNotFoundError``, the
    rest one ``StoreError`` line saying what failed where (and, for credentials, where they come from)."""
    try:
        yield
    except ReproArchiveError:
        raise
    except FileNotFoundError:
        raise StoreNotFoundError(f"{where} does not exist") from None
    except PermissionError as exc:
        raise StoreError(f"{doing} {where}: permission denied ({_short(exc)})", _credentials_hint(where)) from None
    except (OSError, RuntimeError, ValueError, asyncio.TimeoutError) as exc:
        raise _failed(doing, where, _short(exc), exc) from None
    except Exception as exc:  # noqa: BLE001 - backends raise their own types (botocore, aiohttp, azure)
        raise _failed(doing, where, f"{type(exc).__name__}: {_short(exc)}", exc) from None


def _failed(doing: str, where: str, what: str, exc: BaseException) -> StoreError:
    if _is_credentials_error(exc):
        return StoreError(f"{doing} {where} failed: no usable credentials ({what})", _credentials_hint(where))
    return StoreError(f"{doing} {where} failed: {what}", "check that the store is reachable and retry")


def _is_credentials_error(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in (exc, exc.__cause__, exc.__context__) if e is not None}
    text = str(exc).lower()
    return bool(names & {"NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError",
                         "ClientAuthenticationError", "CredentialUnavailableError"}) \
        or "unable to locate credentials" in text or "invalidaccesskeyid" in text or "signaturedoesnotmatch" in text


def _credentials_hint(where: str) -> str:
    scheme = where.split("://", 1)[0] if "://" in where else "file"
    return _CREDENTIALS.get(scheme, "check the store's credentials and permissions (the fsspec backend's own settings)")


_S3_CREDENTIALS = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL for a "
                   "server other than AWS; s3fs reads them, reproarchive never handles them")
_CREDENTIALS = {
    "s3": _S3_CREDENTIALS, "s3a": _S3_CREDENTIALS,
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file "
          "(or run `gcloud auth application-default login`)",
    "gcs": "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file "
           "(or run `gcloud auth application-default login`)",
    "az": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY",
    "abfs": "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY",
    "file": "check that you may read and write the folder",
}

# An in-memory filesystem is one dict per process: a lock makes its ``create`` atomic.
_MEMORY_CREATE = threading.Lock()


class FsspecStore(Store):
    """A store on any fsspec filesystem (the URL forms in the module docstring)."""

    def __init__(self, url: str | os.PathLike, **storage_options):
        self.url = os.fspath(url).rstrip("/") or "/"
        protocol = (_URL_RE.match(self.url).group(1) if has_scheme(self.url) else "file")
        try:
            import fsspec
            from fsspec.registry import known_implementations
        except ImportError:  # pragma: no cover - torch depends on fsspec
            raise StoreError("fsspec is not installed", "pip install 'reproarchive[store]'") from None
        if protocol not in known_implementations and protocol not in fsspec.available_protocols():
            raise StoreURLError(f"{self.url}: {protocol}:// is not a kind of store reproarchive knows",
                             "use s3://, gs://, az://, memory://, file:// or a local folder")
        try:
            self.fs, root = fsspec.core.url_to_fs(self.url, **storage_options)
        except ImportError as exc:
            package = _EXTRAS.get(protocol, f"the fsspec backend for {protocol}://")
            raise StoreError(f"{protocol}:// stores need {package}, which is not installed",
                             f"pip install 'reproarchive[store]' (S3) or pip install {package}") from exc
        except ValueError as exc:
            raise StoreURLError(f"{self.url} is not a store location fsspec understands: {exc}") from None
        self.root = root.rstrip("/")
        protocols = _protocols(self.fs)
        self.local = "file" in protocols
        self.memory = "memory" in protocols
        self.async_impl = bool(getattr(self.fs, "async_impl", False))
        # a conditional PUT on S3, a hard link in a folder, a lock in memory
        self.atomic_create = self.local or self.memory or bool(set(protocols) & {"s3", "s3a"})

    def path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def missing_root(self) -> str | None:
        if self.local or self.memory:
            return None  # created on demand by the first push
        bucket = self.root.split("/", 1)[0]
        with self._errors("looking up"):
            if bucket and not self.fs.exists(bucket):
                return f"the bucket {bucket!r} does not exist"
        return None

    def _errors(self, doing: str, key: str | None = None):
        return backend_errors(doing, f"{self.url}/{key}" if key else self.url)

    def refresh(self) -> None:
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache()

    # -- reading
    def size(self, key: str) -> int | None:
        with self._errors("looking up", key):
            try:
                info = self.fs.info(self.path(key))
            except FileNotFoundError:
                return None
            return _object_size(info)

    def sizes(self, keys: Iterable[str], *, jobs: int = 16) -> dict[str, int | None]:
        """One batch of concurrent lookups on fsspec's event loop (threads for a sync backend)."""
        keys = list(dict.fromkeys(keys))
        if not keys or not self.async_impl:
            return super().sizes(keys, jobs=jobs)
        from fsspec.asyn import _run_coros_in_chunks, sync

        async def one(key):
            try:
                return _object_size(await self.fs._info(self.path(key)))
            except FileNotFoundError:
                return None

        async def batch():
            return await _run_coros_in_chunks([one(k) for k in keys], batch_size=jobs * 4, return_exceptions=True)

        with self._errors("looking up blobs in"):
            found = sync(self.fs.loop, batch)
        for key, value in zip(keys, found):
            if isinstance(value, BaseException):
                with self._errors("looking up", key):
                    raise value
        return dict(zip(keys, found))

    def read_range(self, key: str, start: int, end: int) -> bytes:
        with self._errors("reading", key):
            return self.fs.cat_file(self.path(key), start=start, end=end)

    def list(self, prefix: str) -> list[str]:
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
        """A PUT, or a temporary file and a rename in a folder."""
        self.check_writable()
        with self._errors("writing", key):
            if self.local:
                with atomic_file(self.path(key)) as f:
                    f.write(data)
            else:
                self.fs.pipe_file(self.path(key), data)

    def create(self, key: str, data: bytes) -> bool:
        self.check_writable()
        with self._errors("writing", key):
            if self.local:
                return _local_create(self.path(key), [data])
            if self.memory:
                with _MEMORY_CREATE:
                    if self.fs.exists(self.path(key)):
                        return False
                    self.fs.pipe_file(self.path(key), data)
                    return True
            if not self.atomic_create:
                return self._lookup_then_write(key, data)
            try:
                self.fs.pipe_file(self.path(key), data, mode="create")
            except FileExistsError:
                return False
            except OSError as exc:
                if exc.errno != errno.ENOSYS:  # an S3 API without conditional writes answers 501
                    raise
                self.atomic_create = False
                return self._lookup_then_write(key, data)
            return True

    supports_delete = True

    def delete(self, key: str) -> None:
        self.check_writable()
        with self._errors("deleting", key):
            try:
                self.fs.rm_file(self.path(key))
            except FileNotFoundError:
                pass

    def _lookup_then_write(self, key: str, data: bytes) -> bool:
        if self.size(key) is not None:
            return False
        self.fs.pipe_file(self.path(key), data)
        return True

    def write_stream(self, key: str, size: int, chunks: Iterable, *, on_chunk: Callable[[int], None] | None = None,
                     exclusive: bool = False) -> bool:
        """Small objects are joined and sent in one request; larger ones are streamed (multipart
        on S3) and, if anything fails, discarded rather than committed half-written."""
        if size <= self.stream_bytes or self.memory:
            return super().write_stream(key, size, chunks, on_chunk=on_chunk, exclusive=exclusive)
        self.check_writable()

        def counted():
            for c in chunks:
                yield c
                if on_chunk:
                    on_chunk(len(c))

        with self._errors("writing", key):
            if self.local:
                if exclusive:
                    return _local_create(self.path(key), counted())
                with atomic_file(self.path(key)) as f:
                    for c in counted():
                        f.write(c)
                return True
            if exclusive and not self.atomic_create and self.size(key) is not None:
                return False
            try:
                f = self.fs.open(self.path(key), "xb" if exclusive and self.atomic_create else "wb",
                                 block_size=max(CHUNK_BYTES, 5 << 20))
            except FileExistsError:
                return False
            try:
                for c in counted():
                    f.write(c)
            except BaseException:
                # never close() it: fsspec's close commits what was written so far
                discard = getattr(f, "discard", None)
                if discard is not None:
                    with contextlib.suppress(Exception):
                        discard()
                f.closed = True  # and its finaliser must not try either
                raise
            try:
                f.close()
            except FileExistsError:  # the conditional completion lost the race
                return False
            return True


def _local_create(path: str, chunks: Iterable) -> bool:
    """Write to a temporary file, then hard-link it to ``path``: the link fails if ``path``
    exists, so two writers cannot both create it, and a reader never sees it half-written."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.partial"
    with atomic_file(tmp) as f:
        for c in chunks:
            f.write(c)
    try:
        os.link(tmp, final)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    return True


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

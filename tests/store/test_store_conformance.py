"""Every store backend we ship against the conformance suite: memory://, file:// (and a plain
folder), and S3 through moto's server on 127.0.0.1. Each side door goes around ``FsspecStore``:
the memory filesystem's own object, plain files, boto3.

And two stores that claim less, so that the suite's other side runs too: a read-only mirror
reached by names only (no writes, no listing, no delete) and a store that writes but has no
atomic create, no listing and no delete. A capability a store does not claim is checked to be
refused (``reproarchive.testing.stores``)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from reproarchive.errors import StoreError
from reproarchive.store.backend import Store
from reproarchive.store.location import FsspecStore
from reproarchive.testing.stores import StoreTests


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store(self):
        return FsspecStore(f"memory://conformance-{uuid.uuid4().hex[:12]}/repros")

    def _fs(self):
        from fsspec.implementations.memory import MemoryFileSystem

        return MemoryFileSystem()

    def side_put(self, store, key, data):
        self._fs().pipe_file(f"{store.root}/{key}", data)

    def side_get(self, store, key):
        fs = self._fs()
        path = f"{store.root}/{key}"
        return fs.cat_file(path) if fs.exists(path) else None


class TestFileStore(StoreTests):
    url_form = "file://{}"

    @pytest.fixture
    def store(self, tmp_path):
        self.root = tmp_path / "store"
        return FsspecStore(self.url_form.format(self.root))

    def side_put(self, store, key, data):
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def side_get(self, store, key):
        path: Path = self.root / key
        leftovers = ([p.name for p in path.parent.glob(f"*{path.name}*") if p.name != path.name]
                     if path.parent.is_dir() else [])
        assert not leftovers, f"temporary files left behind: {leftovers}"
        return path.read_bytes() if path.is_file() else None


class TestFolderStore(TestFileStore):
    url_form = "{}"


class TestS3Store(StoreTests):
    @pytest.fixture
    def store(self, s3_store):
        return FsspecStore(s3_store)

    def _client_and_key(self, store, key):
        import boto3

        bucket, _, prefix = store.url[len("s3://"):].partition("/")
        return boto3.client("s3"), bucket, f"{prefix}/{key}" if prefix else key

    def side_put(self, store, key, data):
        client, bucket, name = self._client_and_key(store, key)
        client.put_object(Bucket=bucket, Key=name, Body=data)

    def side_get(self, store, key):
        client, bucket, name = self._client_and_key(store, key)
        try:
            return client.get_object(Bucket=bucket, Key=name)["Body"].read()
        except client.exceptions.NoSuchKey:
            return None


class _NamesOnly(FsspecStore):
    """memory:// reached by names only, with no delete: ``list`` and ``delete`` refuse."""

    supports_listing = False
    supports_delete = False

    def __init__(self, url, *, writes: bool):
        super().__init__(url)
        self.supports_writes = writes
        self.atomic_create = False

    def list(self, prefix):
        raise StoreError(f"{self.url} cannot list objects", "name the archive: STORE/NAME")

    delete = Store.delete


class TestReadOnlyStore(TestMemoryStore):
    """A read-only mirror: every write, create, stream, delete and push refused, nothing listed."""

    @pytest.fixture
    def store(self):
        return _NamesOnly(f"memory://conformance-{uuid.uuid4().hex[:12]}/repros", writes=False)


class TestWritableStoreWithoutTheRest(TestMemoryStore):
    """Writes, but no atomic create, no listing and no delete."""

    @pytest.fixture
    def store(self):
        return _NamesOnly(f"memory://conformance-{uuid.uuid4().hex[:12]}/repros", writes=True)

"""Stores to test against: a real S3 API (moto's server on 127.0.0.1, started once per session
and stopped at its end), a local folder, file:// and memory://; and small archives that share
blobs the way a model's failures do."""

from __future__ import annotations

import uuid

import pytest

from support import s3server
from support.store_archives import make_archive


@pytest.fixture(scope="session")
def s3_endpoint():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    with s3server.threaded_server() as endpoint, s3server.client_environment(endpoint):
        yield endpoint


@pytest.fixture
def s3_store(s3_endpoint):
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    s3server.make_bucket(bucket)
    return f"s3://{bucket}/repros"


@pytest.fixture(params=["s3", "folder", "file", "memory"])
def any_store(request, tmp_path):
    """Every kind of store reproarchive supports, one test each."""
    if request.param == "s3":
        return request.getfixturevalue("s3_store")
    if request.param == "folder":
        return str(tmp_path / "store")
    if request.param == "file":
        return f"file://{tmp_path / 'store'}"
    return f"memory://store-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def archives(tmp_path):
    """Two archives sharing three of their five blobs, and a third of another failure."""
    a = make_archive(tmp_path / "a.tar.zst", own_seed=1)
    b = make_archive(tmp_path / "b.tar.zst", own_seed=2)
    c = make_archive(tmp_path / "c.tar.zst", shared_seed=7, own_seed=3, signature="forward|ValueError|bad shape")
    return a, b, c

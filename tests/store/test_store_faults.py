"""Faults: an upload interrupted mid-way, a store that answers errors, a corrupted blob, two
pushes at once, and a hostile store whose names, sizes and objects do not match their digests."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from pathlib import Path

import fsspec
import msgpack
import pytest
import torch
import torch.fx as fx

import reproarchive
from reproarchive.store import location, objects
from reproarchive.store import push as push_module
from reproarchive.store.location import FsspecStore as Store
from support import hostile_corpus
from support.cli import invoke
from support.store_archives import make_archive


def fs_of(store: str):
    return fsspec.core.url_to_fs(store)


def put(store: str, key: str, data: bytes) -> None:
    fs, root = fs_of(store)
    fs.pipe_file(f"{root}/{key}", data)


def get(store: str, key: str) -> bytes:
    fs, root = fs_of(store)
    return fs.cat_file(f"{root}/{key}")


def refs_and_archives(store: str) -> tuple[list, list]:
    s = Store(store)
    s.refresh()
    return s.list("refs"), s.list("archives/sha256")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --------------------------------------------------------------------------------------------
# interrupted


@pytest.mark.parametrize("kind", ["s3", "folder"])
def test_an_interrupted_push_names_nothing_and_the_next_push_completes_it(kind, request, tmp_path, monkeypatch):
    store = request.getfixturevalue("s3_store") if kind == "s3" else str(tmp_path / "store")
    gen = torch.Generator().manual_seed(0)
    # one blob large enough to go up in parts (multipart on S3), cut in the middle of it
    big = torch.randn(3 << 20, generator=gen)
    small = [torch.randn(4096, generator=gen) for _ in range(3)]
    gm = fx.symbolic_trace(lambda a, b, c, d: a.sum() + b.sum() + c.sum() + d.sum())
    path = reproarchive.pack(gm, [big, *small], tmp_path / "big.tar.zst")
    monkeypatch.setattr(location.FsspecStore, "stream_bytes", 1 << 20)
    monkeypatch.setattr(push_module, "CHUNK_BYTES", 1 << 20)
    real = Store.write_stream

    def interrupted(self, key, size, chunks, **kw):
        if size > 1 << 20:
            def cut():
                for i, chunk in enumerate(chunks):
                    if i == 7:  # after one 5 MiB part went up
                        raise KeyboardInterrupt
                    yield chunk
            return real(self, key, size, cut(), **kw)
        return real(self, key, size, chunks, **kw)

    monkeypatch.setattr(Store, "write_stream", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reproarchive.push([path], store, jobs=1)
    assert refs_and_archives(store) == ([], [])
    sizes = Store(store).sizes(Store(store).list("blobs/sha256"))
    assert all(size < (1 << 20) for size in sizes.values()), "the cut object must not exist, not even in part"

    monkeypatch.setattr(Store, "write_stream", real)
    (done,) = reproarchive.push([path], store)
    assert done.uploaded_blobs == done.blobs - len(sizes)
    out = reproarchive.pull(f"{store}/{done.name}", tmp_path / "out.tar.zst").path
    assert out.read_bytes() == Path(path).read_bytes()


# --------------------------------------------------------------------------------------------
# a store that answers errors


class _Failing(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        body = b"<?xml version='1.0'?><Error><Code>InternalError</Code><Message>we are down</Message></Error>"
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(500)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def failing_endpoint(s3_endpoint):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_store_answering_errors_is_one_line_and_exit_5(failing_endpoint, archives, tmp_path):
    a, _, _ = archives
    options = {"endpoint_url": failing_endpoint, "retries": 1, "skip_instance_cache": True,
               "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}}}
    started = time.monotonic()
    with pytest.raises(reproarchive.errors.StoreError) as info:
        reproarchive.push([a], "s3://bucket/repros", storage_options=options)
    assert info.value.exit_code == 5 and "\n" not in str(info.value)
    assert "s3://bucket/repros" in str(info.value)
    with pytest.raises(reproarchive.errors.StoreError):
        reproarchive.pull("s3://bucket/repros/name", tmp_path / "x.tar.zst", storage_options=options)
    with pytest.raises(reproarchive.errors.StoreError):
        reproarchive.list_store("s3://bucket/repros", storage_options=options)
    assert time.monotonic() - started < 60
    assert not (tmp_path / "x.tar.zst").exists()


def test_the_cli_reports_a_failing_store_in_one_line(failing_endpoint, archives, monkeypatch):
    a, _, _ = archives
    monkeypatch.setenv("AWS_ENDPOINT_URL", failing_endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    fsspec.filesystem("s3").clear_instance_cache()
    try:
        result = invoke("push", a, "s3://bucket/repros", "--json")
        assert result.exit_code == 5, result.output
        assert json.loads(result.stdout)["exit_code"] == 5
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
        result = invoke("ls", "s3://bucket/repros")
        assert result.exit_code == 5 and "Traceback" not in result.output
    finally:
        fsspec.filesystem("s3").clear_instance_cache()


# --------------------------------------------------------------------------------------------
# a corrupted blob


@pytest.mark.parametrize("damage", ["flipped", "truncated", "longer", "missing"])
def test_a_corrupted_blob_is_named_and_nothing_is_written(damage, s3_store, archives, tmp_path):
    a, _, _ = archives
    (pushed,) = reproarchive.push([a], s3_store)
    key = sorted(Store(s3_store).list("blobs/sha256"))[2]
    data = get(s3_store, key)
    if damage == "missing":
        fs, root = fs_of(s3_store)
        fs.rm(f"{root}/{key}")
    else:
        put(s3_store, key, {"flipped": data[:100] + bytes([data[100] ^ 1]) + data[101:], "truncated": data[:-10],
                            "longer": data + data[:1000]}[damage])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(reproarchive.errors.CorruptStoreError, match=key.split("/")[-1]) as info:
        reproarchive.pull(f"{s3_store}/{pushed.name}", out_dir / "a.tar.zst")
    assert info.value.exit_code == 2
    assert leftovers(out_dir) == []
    result = invoke("pull", f"{s3_store}/{pushed.name}", "-o", out_dir / "a.tar.zst")
    assert result.exit_code == 2 and key.split("/")[-1] in result.stderr and leftovers(out_dir) == []


# --------------------------------------------------------------------------------------------
# two pushes at once


@pytest.mark.parametrize("kind", ["s3", "folder"])
def test_two_pushes_sharing_blobs_at_once(kind, request, tmp_path):
    store = request.getfixturevalue("s3_store") if kind == "s3" else str(tmp_path / "store")
    paths = [make_archive(tmp_path / f"p{i}.tar.zst", own_seed=10 + i) for i in range(4)]
    barrier = threading.Barrier(2)
    results: dict = {}
    errors: list = []

    def worker(mine):
        try:
            barrier.wait()
            results[mine[0]] = reproarchive.push(mine, store, jobs=4)
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(paths[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(Store(store).list("blobs/sha256")) == 3 + 4 * 2  # shared weights once, two own blobs each
    for path in paths:
        out = reproarchive.pull(f"{store}/{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}",
                                tmp_path / "o" / path.name)
        assert out.path.read_bytes() == path.read_bytes()
    assert reproarchive.list_store(store)["archives"] == 4


# --------------------------------------------------------------------------------------------
# a hostile store


@pytest.fixture
def pushed_store(tmp_path, archives):
    store = str(tmp_path / "store")
    (pushed,) = reproarchive.push([archives[0]], store)
    return store, pushed


def _archive_object(store: str, digest: str) -> dict:
    return msgpack.unpackb(get(store, objects.archive_key(digest)), raw=False)


def _put_archive_object(store, digest, plain) -> None:
    put(store, objects.archive_key(digest), msgpack.packb(plain, use_bin_type=True))


def test_hostile_refs(pushed_store, tmp_path):
    store, pushed = pushed_store
    cases = {
        "garbage": b"\x00not json",
        "bad-digest": json.dumps({"format": objects.REF_FORMAT, "archive": "sha256:../../etc", "size": 1,
                                  "pushed": "x", "summary": {}}).encode(),
        "huge": b" " * (objects.MAX_REF_BYTES + 1),
        "negative": json.dumps({"format": objects.REF_FORMAT, "archive": pushed.digest, "size": -5,
                                "pushed": "x", "summary": {}}).encode(),
    }
    for name, data in cases.items():
        put(store, f"refs/{name}", data)
        with pytest.raises(reproarchive.errors.ArchiveError):
            reproarchive.pull(f"{store}/{name}", tmp_path / "x.tar.zst")
    nowhere = json.dumps({"format": objects.REF_FORMAT, "archive": "sha256:" + "0" * 64, "size": 10, "pushed": "x",
                          "summary": {}}).encode()
    put(store, "refs/nowhere", nowhere)
    with pytest.raises(reproarchive.errors.StoreNotFoundError, match="does not hold it"):
        reproarchive.pull(f"{store}/nowhere", tmp_path / "x.tar.zst")
    put(store, "refs/.hidden", b"{}")
    put(store, "refs/with space", b"{}")
    listing = reproarchive.list_store(store)
    assert sorted(r["name"] for g in listing["groups"] for r in g["archives"]) == sorted([pushed.name, "nowhere"])
    assert len(listing["warnings"]) == 6  # four broken refs, two invalid names
    assert not (tmp_path / "x.tar.zst").exists()


def _edits(pushed):
    blob_hex = "a" * 64

    def segments(plain, fn):
        plain["segments"] = fn(plain["segments"])

    def first_blob(plain):
        return next(s for s in plain["segments"] if isinstance(s, dict))

    return {
        "not msgpack": lambda plain: b"\xc1garbage",
        "wrong digest field": lambda plain: plain.update(digest="sha256:" + "b" * 64),
        "sizes do not add up": lambda plain: plain.update(size=plain["size"] + 1),
        "key escapes the blobs": lambda plain: first_blob(plain).update(
            key=first_blob(plain)["blob"] + "/../../refs/x"),
        "not a blob name": lambda plain: first_blob(plain).update(
            blob="blobs/md5/" + blob_hex, key="blobs/md5/" + blob_hex),
        "blob size lies": lambda plain: (first_blob(plain).update(size=first_blob(plain)["size"] + 7),
                                         plain.update(size=plain["size"] + 7)),
        "inline byte changed": lambda plain: segments(plain, lambda s: [bytes([s[0][0] ^ 1]) + s[0][1:], *s[1:]]),
        "msgpack bomb": lambda plain: b"\xdd\xff\xff\xff\xff" + b"\x90" * 16,
    }


def test_hostile_archive_objects_are_refused(pushed_store, tmp_path):
    store, pushed = pushed_store
    original = get(store, objects.archive_key(pushed.digest))
    for what, edit in _edits(pushed).items():
        plain = msgpack.unpackb(original, raw=False)
        replaced = edit(plain)
        put(store, objects.archive_key(pushed.digest), replaced if isinstance(replaced, bytes) else
            msgpack.packb(plain, use_bin_type=True))
        with pytest.raises(reproarchive.errors.ArchiveError) as info:
            reproarchive.pull(f"{store}/{pushed.name}", tmp_path / "x.tar.zst")
        assert info.value.exit_code == 2, what
        assert not (tmp_path / "x.tar.zst").exists(), what
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".x.tar.zst")] == [], what
    put(store, objects.archive_key(pushed.digest), original)
    assert reproarchive.pull(f"{store}/{pushed.name}", tmp_path / "x.tar.zst").path.exists()


def test_a_hostile_archive_in_a_store_is_refused_like_a_hostile_file(tmp_path, monkeypatch):
    """A store can hold a self-consistent archive whose blob is not what its name says (its
    pusher skipped the check): pull verifies it like any archive and writes nothing; push
    refuses to send such a blob at all."""
    valid = hostile_corpus.make_valid(tmp_path / "valid.tar.zst")
    p = hostile_corpus.parse(valid.read_bytes())
    blob = next(n for n, _ in p.members if n.startswith("blobs/"))
    content = dict(p.members)[blob]
    bad = hostile_corpus.rebuild(p, edit_members=lambda m: [(n, bytes([d[0] ^ 1]) + d[1:] if n == blob else d)
                                                            for n, d in m])
    path = tmp_path / "bad.tar.zst"
    path.write_bytes(bad)
    assert len(content) > 0
    store = str(tmp_path / "store")
    with pytest.raises(reproarchive.errors.CorruptStoreError, match="does not hash to its name"):
        reproarchive.push([path], store)
    assert refs_and_archives(store) == ([], []) and blob not in Store(store).list("blobs/sha256")

    class NoCheck(objects.BlobCheck):
        def finish(self):
            pass

    monkeypatch.setattr(push_module, "BlobCheck", NoCheck)
    (pushed,) = reproarchive.push([path], store)
    monkeypatch.undo()
    with pytest.raises(reproarchive.errors.DigestMismatchError, match=blob):
        reproarchive.pull(f"{store}/{pushed.name}", tmp_path / "out.tar.zst")
    assert not (tmp_path / "out.tar.zst").exists()

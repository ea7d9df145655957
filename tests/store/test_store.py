"""Push, pull, ls, inspect, load and run through every kind of store: a real S3 API (moto's
server), a local folder, file:// and memory://."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fsspec
import pytest
import torch

import reproarchive
from reproarchive.store import objects
from reproarchive.store.location import FsspecStore as Store


def sha256(path) -> str:
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def keys(store: str, prefix: str) -> list[str]:
    return sorted(Store(store).list(prefix))


def test_push_then_pull_rebuilds_the_same_bytes(any_store, archives, tmp_path):
    a, b, _ = archives
    (first,) = reproarchive.push([a], any_store)
    assert first.digest == sha256(a) and first.uploaded_blobs == first.blobs == 5
    (second,) = reproarchive.push([b], any_store)
    # b shares its three weights with a: only its own two blobs travel
    assert (second.blobs, second.uploaded_blobs) == (5, 2)

    for reference in (f"{any_store}/{second.name}", f"{any_store}/{second.digest[7:15]}",
                      f"{any_store}/sha256:{second.digest[7:19]}"):
        out = tmp_path / "pulled" / "b.tar.zst"
        result = reproarchive.pull(reference, out)
        assert out.read_bytes() == Path(b).read_bytes()
        assert result.digest == second.digest
        out.unlink()
    assert not list((tmp_path / "pulled").iterdir())  # no temporary file left behind

    # the layout of spec §11
    store = Store(any_store)
    marker = json.loads(store.read_small("reproarchive-store", 4096))
    assert marker == {"format": "reproarchive-store", "version": "1.1"}
    assert keys(any_store, "refs") == sorted([f"refs/{first.name}", f"refs/{second.name}"])
    assert keys(any_store, "archives/sha256") == sorted(objects.archive_key(d) for d in (first.digest, second.digest))
    blobs = keys(any_store, "blobs/sha256")
    assert len(blobs) == 7
    # a blob object is the member's frames as in the archive: zstd -d of it hashes to its name
    import zstandard

    for key in blobs:
        data = zstandard.ZstdDecompressor().stream_reader(store.read_range(key, 0, 1 << 30),
                                                          read_across_frames=True).read()
        assert hashlib.sha256(data).hexdigest() == key.rsplit("/", 1)[1]


def test_pushing_again_uploads_nothing_but_the_ref(any_store, archives):
    a, _, _ = archives
    (first,) = reproarchive.push([a], any_store)
    (again,) = reproarchive.push([a], any_store)
    assert again.name == first.name and again.uploaded_blobs == 0
    assert again.uploaded_bytes < 2048  # the ref alone
    (named,) = reproarchive.push([a], any_store, name="resnet-nightly")
    assert named.name == "resnet-nightly" and named.replaced is None


def test_a_name_that_moves_says_where_it_pointed(tmp_path, archives):
    a, b, _ = archives
    store = str(tmp_path / "store")
    (first,) = reproarchive.push([a], store, name="latest")
    (moved,) = reproarchive.push([b], store, name="latest")
    assert moved.replaced == first.digest
    out = reproarchive.pull(f"{store}/latest", tmp_path / "x.tar.zst").path
    assert out.read_bytes() == Path(b).read_bytes()


def test_ls_groups_archives_by_failure_signature(any_store, archives):
    a, b, c = archives
    pushed = reproarchive.push([a, b, c], any_store)
    listing = reproarchive.list_store(any_store)
    assert listing["archives"] == 3 and listing["warnings"] == []
    groups = {g["signature"]: [r["name"] for r in g["archives"]] for g in listing["groups"]}
    assert sorted(groups["compile|RuntimeError|boom"]) == sorted([pushed[0].name, pushed[1].name])
    assert groups["forward|ValueError|bad shape"] == [pushed[2].name]
    row = next(r for g in listing["groups"] for r in g["archives"] if r["name"] == pushed[2].name)
    assert row["ops"] == reproarchive.inspect(c).graph.ops
    assert row["inputs"] == {"real": 5, "absent": 0, "values": 0}
    assert row["bytes_stored"] == Path(c).stat().st_size
    assert row["bytes_logical"] == reproarchive.inspect(c).storage.bytes_logical
    assert row["backend"] == "eager" and row["digest"] == pushed[2].digest


def test_inspect_reads_the_archive_object_alone(any_store, archives):
    a, _, _ = archives
    (pushed,) = reproarchive.push([a], any_store)
    fs, root = fsspec.core.url_to_fs(any_store)
    for key in Store(any_store).list("blobs/sha256"):  # no blob can be read any more
        fs.rm(f"{root}/{key}")
    info = reproarchive.inspect(f"{any_store}/{pushed.name}").to_plain()
    local = reproarchive.inspect(a).to_plain()
    assert info["digest"] == local["digest"] and info["graph"] == local["graph"] and info["inputs"] == local["inputs"]
    assert info["storage"] == local["storage"]
    assert info["store"]["archive"] == pushed.digest and info["path"] == f"{any_store}/{pushed.name}"


def test_load_and_run_take_a_store_reference(s3_store, archives, tmp_path, monkeypatch):
    a, _, _ = archives
    monkeypatch.setenv("REPROARCHIVE_CACHE", str(tmp_path / "cache"))
    (pushed,) = reproarchive.push([a], s3_store)
    reference = f"{s3_store}/{pushed.name}"
    repro = reproarchive.load(reference)
    local = reproarchive.load(a)
    assert all(torch.equal(x, y) for x, y in zip(repro.args, local.args))
    cached = tmp_path / "cache" / f"{pushed.digest[7:]}.tar.zst"
    assert cached.read_bytes() == Path(a).read_bytes()
    outcome = reproarchive.run(reference)  # the eager backend passes: the recorded failure is gone
    assert outcome.exit_code == 0


def test_archives_packed_differently_share_no_frames_but_both_pull(tmp_path):
    """The same blob compressed at another level is kept under a variant key, so each archive
    still rebuilds byte for byte (spec §11.2)."""
    import torch.fx as fx

    store = str(tmp_path / "store")
    gm = fx.symbolic_trace(lambda x: x.relu())
    data = torch.arange(64 * 1024, dtype=torch.float32) % 97  # compressible: levels differ
    paths = []
    for level in (1, 19):
        paths.append(reproarchive.pack(gm, [data], tmp_path / f"level{level}.tar.zst", level=level))
    reproarchive.push(paths, store)
    names = keys(store, "blobs/sha256")
    assert len(names) == 2 and len(names[0]) + 17 == len(names[1])  # the member name, and a variant
    for path in paths:
        out = reproarchive.pull(f"{store}/{sha256(path)[7:19]}", tmp_path / "out" / path.name).path
        assert out.read_bytes() == path.read_bytes()


def test_pull_of_a_missing_name_or_ambiguous_prefix(tmp_path, archives):
    a, b, _ = archives
    store = str(tmp_path / "store")
    reproarchive.push([a, b], store)
    with pytest.raises(reproarchive.errors.StoreNotFoundError, match="no archive named 'nothing'"):
        reproarchive.pull(f"{store}/nothing", tmp_path / "x.tar.zst")
    digests = sorted(sha256(p)[7:] for p in (a, b))
    common = next(i for i in range(64) if digests[0][i] != digests[1][i])
    if common >= 4:
        with pytest.raises(reproarchive.errors.StoreNotFoundError, match="give more digits"):
            reproarchive.pull(f"{store}/{digests[0][:common]}", tmp_path / "x.tar.zst")
    with pytest.raises(reproarchive.errors.StoreNotFoundError, match="not a reproarchive store"):
        reproarchive.pull(f"{tmp_path / 'elsewhere'}/x", tmp_path / "x.tar.zst")
    assert not (tmp_path / "x.tar.zst").exists()

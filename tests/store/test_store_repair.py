"""A store that can be trusted at scale: damage in place is found (``fsck``), named with the
archives it breaks, recorded, and replaced by the next push of a good copy (or at once by
``push --repair``); concurrent pushers in separate processes lose nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import zstandard

import reproarchive
from reproarchive.store.location import FsspecStore
from reproarchive.store.objects import damage_key
from support.cli import invoke
from support.store_archives import make_archive


def _fs(store: str):
    return fsspec.core.url_to_fs(store)


def _get(store: str, key: str) -> bytes:
    fs, root = _fs(store)
    return fs.cat_file(f"{root}/{key}")


def _put(store: str, key: str, data: bytes) -> None:
    fs, root = _fs(store)
    fs.pipe_file(f"{root}/{key}", data)


def _shared_blob(store: str) -> str:
    """A blob object both archives of the fixture use (the shared weights)."""
    s = FsspecStore(store)
    s.refresh()
    counts: dict[str, int] = {}
    for digest_key in s.list("archives/sha256"):
        from reproarchive.store.pull import read_archive_object

        for seg in read_archive_object(s, "sha256:" + digest_key.rsplit("/", 1)[1]).blobs():
            counts[seg.key] = counts.get(seg.key, 0) + 1
    return sorted(k for k, n in counts.items() if n == 2)[0]


def _flip(store: str, key: str) -> None:
    data = bytearray(_get(store, key))
    data[len(data) // 2] ^= 0x01  # same size: a push that checks sizes sees nothing
    _put(store, key, bytes(data))


@pytest.fixture(params=["s3", "folder"])
def damaged(request, tmp_path):
    """Two archives sharing blobs pushed to a store, then one shared blob corrupted in place."""
    store = request.getfixturevalue("s3_store") if request.param == "s3" else str(tmp_path / "store")
    a = make_archive(tmp_path / "a.tar.zst", own_seed=1)
    b = make_archive(tmp_path / "b.tar.zst", own_seed=2)
    pushed = reproarchive.push([a, b], store)
    key = _shared_blob(store)
    _flip(store, key)
    return store, key, (a, b), pushed


def _pull_fails(store, name, out: Path, key: str) -> str:
    with pytest.raises(reproarchive.errors.CorruptStoreError) as info:
        reproarchive.pull(f"{store}/{name}", out)
    assert key.rsplit("/", 1)[1] in str(info.value) and not out.exists()
    return info.value.hint


def test_damage_in_place_is_replaced_by_push_repair_and_a_plain_push_does_not_pretend(damaged, tmp_path):
    store, key, (a, b), pushed = damaged
    hint = _pull_fails(store, pushed[0].name, tmp_path / "x.tar.zst", key)
    assert "push --repair" in hint and store in hint  # the hint names the command that repairs

    (again,) = reproarchive.push(a, store)  # trusted by size: it sends nothing and repairs nothing
    assert again.uploaded_blobs == 0 and again.repaired_blobs == ()
    _pull_fails(store, pushed[1].name, tmp_path / "x.tar.zst", key)

    (fixed,) = reproarchive.push(a, store, repair=True)
    assert fixed.repaired_blobs == (key,)
    for p, archive in zip(pushed, (a, b)):  # both archives sharing the blob pull again
        out = reproarchive.pull(f"{store}/{p.name}", tmp_path / "ok" / archive.name)
        assert out.path.read_bytes() == archive.read_bytes()
    (clean,) = reproarchive.push(b, store, repair=True)  # nothing left to repair
    assert clean.repaired_blobs == ()


def test_fsck_names_the_damage_and_the_archives_it_breaks_and_the_next_push_repairs(damaged, tmp_path):
    store, key, (a, b), pushed = damaged
    report = reproarchive.check_store(store)
    assert not report.ok and report.blobs_checked == report.blobs_total == 7
    (bad,) = report.damaged
    assert bad.key == key and set(bad.archives) == {p.name for p in pushed}
    assert report.marked == 1 and FsspecStore(store).size(damage_key(key)) is not None

    (repaired,) = reproarchive.push(b, store)  # marked: a plain push of a good copy replaces it
    assert repaired.repaired_blobs == (key,)
    s = FsspecStore(store)
    s.refresh()
    assert s.size(damage_key(key)) is None  # the record is done
    assert reproarchive.check_store(store).ok
    out = reproarchive.pull(f"{store}/{pushed[0].name}", tmp_path / "a2.tar.zst")
    assert out.path.read_bytes() == a.read_bytes()


def test_fsck_cli_sample_blob_json_and_exit_codes(damaged, tmp_path):
    store, key, _, _ = damaged
    result = invoke("fsck", store, "--no-mark", "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and [d["key"] for d in doc["damaged"]] == [key] and doc["marked"] == 0

    result = invoke("fsck", store, "--blob", key.rsplit("/", 1)[1][:12])
    assert result.exit_code == 1 and f"DAMAGED {key}" in result.stdout and "push --repair" in result.stderr

    sample = reproarchive.check_store(store, sample=3, seed=0, mark=False)
    assert sample.sampled and sample.blobs_checked == 3

    result = invoke("fsck", store, "--blob", "ffffffffffff", "--json")
    assert result.exit_code == 4 and json.loads(result.stdout)["exit_code"] == 4

    result = invoke("fsck", str(tmp_path / "no-store-here"), "--json")
    assert result.exit_code == 4 and json.loads(result.stdout)["error"]["code"]


def test_fsck_finds_frames_that_decompress_right_but_are_not_what_the_archives_recorded(tmp_path):
    """Another compression of the right bytes under the blob's key: the content is right, but
    every archive that recorded the old frames would fail to rebuild."""
    store = str(tmp_path / "store")
    a = make_archive(tmp_path / "a.tar.zst", own_seed=1)
    reproarchive.push(a, store)
    key = sorted(FsspecStore(store).list("blobs/sha256"))[0]
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(_get(store, key))
    _put(store, key, zstandard.ZstdCompressor(level=19, write_checksum=True).compress(raw))
    (bad,) = reproarchive.check_store(store, mark=False).damaged
    assert bad.key == key and "recorded" in bad.reason


_PUSHER = """
import sys, reproarchive
reproarchive.push(sys.argv[2:], sys.argv[1], jobs=4)
"""


def test_pushers_in_separate_processes_sharing_blobs_lose_nothing(tmp_path):
    store = str(tmp_path / "store")
    paths = [make_archive(tmp_path / f"p{i}.tar.zst", own_seed=20 + i) for i in range(6)]
    procs = [subprocess.Popen([sys.executable, "-c", _PUSHER, store, *[str(p) for p in paths[i::3]]])
             for i in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    assert reproarchive.list_store(store)["archives"] == 6
    assert reproarchive.check_store(store, mark=False).ok
    for path in paths:
        out = reproarchive.pull(f"{store}/{reproarchive.push(path, store)[0].name}", tmp_path / "o" / path.name)
        assert out.path.read_bytes() == path.read_bytes()

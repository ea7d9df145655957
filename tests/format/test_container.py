"""The container promises of spec §2–§5: standard tools read it, bytes are deterministic, one
member can be read without the rest, and the reader's rules reject damaged files."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tarfile

import pytest
import torch
import torch.fx as fx
import zstandard

import reproarchive
from reproarchive.archive.loading import read_input
from reproarchive.format import layout, reader, schema, writer

needs_tar = pytest.mark.skipif(not shutil.which("tar") or not shutil.which("zstd"), reason="needs GNU tar and zstd")


def graph(n: int) -> fx.GraphModule:
    g = fx.Graph()
    xs = [g.placeholder(f"x{i}") for i in range(n)]
    g.output(tuple(xs))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    d = tmp_path_factory.mktemp("sample")
    gen = torch.Generator().manual_seed(0)
    big = torch.randn(3 * 1024 * 1024 // 4 + 123, generator=gen)  # ~3 MiB: several 1 MiB frames
    inputs = [big, torch.arange(10), big[7:100], torch.zeros(4096), torch.tensor(1.5, dtype=torch.bfloat16)]
    path = reproarchive.pack(graph(len(inputs)), inputs, d / "s.tar.zst", frame_size=1 << 20)
    return path, inputs


def test_pack_is_deterministic(tmp_path, sample):
    path, inputs = sample
    again = reproarchive.pack(graph(len(inputs)), inputs, tmp_path / "again.tar.zst", frame_size=1 << 20)
    assert again.read_bytes() == path.read_bytes()


@needs_tar
def test_standard_tools_extract_and_blob_names_are_sha256(tmp_path, sample):
    path, _ = sample
    subprocess.run(["zstd", "-t", "-q", str(path)], check=True)
    for how, cmd in {
        "tar": f"tar --zstd -xf {path}",
        "pipe": f"zstd -dc {path} | tar -xf -",
    }.items():
        out = tmp_path / how
        out.mkdir()
        subprocess.run(cmd, shell=True, check=True, cwd=out)
        blobs = sorted((out / "blobs" / "sha256").iterdir())
        assert blobs
        for blob in blobs:
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
        layout_text = json.dumps({"format": "reproarchive", "version": schema.FORMAT_VERSION}, sort_keys=True)
        assert (out / "reproarchive-layout").read_text().strip() == layout_text
        assert "def forward" in (out / "graph.py").read_text()
    listing = subprocess.run(["zstd", "-l", str(path)], capture_output=True, text=True, check=True).stdout
    assert " 2 " in listing.splitlines()[1]  # two skippable frames: footer and seek table


def test_python_tarfile_streams_it(sample):
    path, _ = sample
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True) as z:
        with tarfile.open(fileobj=z, mode="r|") as tar:
            names = [m.name for m in tar]
    assert names[0] == "reproarchive-layout" and names[-1] == "index.msgpack"
    assert all(m.startswith("blobs/sha256/") for m in names[2:-1])


def test_seek_table_matches_frames(sample):
    path, _ = sample
    data = path.read_bytes()
    n, desc, magic = struct.unpack("<IBI", data[-9:])
    assert magic == 0x8F92EAB1 and desc == 0
    entries = [struct.unpack("<II", data[-9 - 8 * (n - i) : -9 - 8 * (n - i) + 8]) for i in range(n)]
    pos = 0
    out = b""
    dctx = zstandard.ZstdDecompressor()
    for c, d in entries:
        frame = dctx.decompressobj().decompress(data[pos : pos + c])
        assert len(frame) == d
        out += frame
        pos += c
    assert out[:19] == b"reproarchive-layout" and out.endswith(b"\0" * 1024)


def test_reading_one_input_reads_a_bounded_number_of_bytes(sample, monkeypatch):
    path, inputs = sample
    read = []
    real_pread, real_preadv = os.pread, os.preadv

    def counting(fd, n, offset):
        data = real_pread(fd, n, offset)
        read.append(len(data))
        return data

    def counting_v(fd, buffers, offset):
        n = real_preadv(fd, buffers, offset)
        read.append(n)
        return n

    monkeypatch.setattr(os, "pread", counting)
    monkeypatch.setattr(os, "preadv", counting_v)
    small = read_input(path, 1)
    assert torch.equal(small, inputs[1])
    assert sum(read) < 64 * 1024, f"reading a 80-byte input read {sum(read)} bytes"
    read.clear()
    assert torch.equal(read_input(path, "x4"), inputs[4])
    assert sum(read) < 64 * 1024
    read.clear()
    assert torch.equal(read_input(path, 0), inputs[0])  # ~3 MiB in stored frames: read once, no more
    assert inputs[0].untyped_storage().nbytes() <= sum(read) < inputs[0].untyped_storage().nbytes() + 64 * 1024


def test_blake3_digests(tmp_path):
    pytest.importorskip("blake3")
    t = torch.arange(1000, dtype=torch.float32)
    path = reproarchive.pack(graph(1), [t], tmp_path / "b.tar.zst", digest="blake3")
    report = reproarchive.verify(path)
    assert report.blobs == 1
    assert reproarchive.inspect(path).digest_algorithm == "blake3"
    assert torch.equal(reproarchive.load(path).args[0], t)


def test_unpack_matches_tar_and_refuses_to_overwrite(tmp_path, sample):
    path, _ = sample
    dest = reproarchive.unpack(path, tmp_path / "u")
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files[0].startswith("blobs/") and "index.msgpack" in files and "reproarchive-layout" in files
    with pytest.raises(reproarchive.ReproArchiveError, match="already exists"):
        reproarchive.unpack(path, dest)


def _rewrite_footer(data: bytes, **changes) -> bytes:
    n = struct.unpack("<I", data[-9:-5])[0]
    table = 8 + 8 * n + 9
    start = len(data) - table - layout.FOOTER_FRAME_SIZE + 8
    fields = list(struct.unpack("<8sHHIQQ32s", data[start : start + 64]))
    for key, value in changes.items():
        fields[{"major": 1, "minor": 2, "index_frame": 4}[key]] = value
    return data[:start] + struct.pack("<8sHHIQQ32s", *fields) + data[start + 64 :]


@pytest.mark.parametrize(
    "mutate, error, text",
    [
        (lambda d: b"", reproarchive.errors.NotAnArchiveError, "empty"),
        (lambda d: d[: len(d) // 2], reproarchive.errors.TruncatedArchiveError, "truncated"),
        (lambda d: d + b"\0", reproarchive.errors.CorruptArchiveError, "1 unexpected bytes after the end"),
        (lambda d: _rewrite_footer(d, major=2), reproarchive.errors.UnsupportedVersionError, "newer reproarchive"),
        (lambda d: _rewrite_footer(d, index_frame=0), reproarchive.errors.CorruptArchiveError, "index"),
        (lambda d: os.urandom(5000), reproarchive.errors.NotAnArchiveError, "not a reproarchive"),
    ],
)
def test_reader_rejects_broken_files(tmp_path, sample, mutate, error, text):
    path, _ = sample
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(mutate(path.read_bytes()))
    for fn in (reproarchive.verify, reproarchive.load, reproarchive.inspect):
        with pytest.raises(error, match=text):
            fn(bad)


def test_verify_catches_a_flipped_bit_in_blob_data(tmp_path):
    """A blob whose bytes changed but whose frames are well-formed: only the digest can tell."""
    a = torch.arange(2048, dtype=torch.int64)
    path = reproarchive.pack(graph(1), [a], tmp_path / "a.tar.zst")
    with reader.ContainerReader(path) as r:
        index = r.index
        members = [(n, r.read_member(n)) for n in r.members if n != layout.LAYOUT_MEMBER]
    bad = tmp_path / "bad.tar.zst"
    with open(bad, "wb") as f:
        w = writer.ContainerWriter(f)
        for name, data in members:
            if name.startswith("blobs/"):
                data = bytearray(data)
                data[100] ^= 0x01
            w.add_member(name, bytes(data))
        w.finish(index)
    with pytest.raises(reproarchive.errors.DigestMismatchError, match="hashes to"):
        reproarchive.verify(bad)

"""Stored frames (spec §2 rule 5): plain zstd frames of raw blocks that any decoder reads, that
the reader reads straight into its destination, and that the writer picks only for data zstd
would barely shrink."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
import torch.fx as fx
import zstandard

import reproarchive
from reproarchive.format import frames, reader


def incompressible(n: int) -> bytes:
    """Deterministic bytes zstd cannot shrink (sha256 in counter mode)."""
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(i.to_bytes(8, "little")).digest()
        i += 1
    return bytes(out[:n])


def graph(n: int) -> fx.GraphModule:
    g = fx.Graph()
    g.output(tuple(g.placeholder(f"x{i}") for i in range(n)))
    return fx.GraphModule(torch.nn.Module(), g)


def frame_bytes(chunks) -> bytes:
    return b"".join(bytes(c) for c in chunks)


@pytest.mark.parametrize("n", [1, 1000, frames.RAW_BLOCK_BYTES, frames.RAW_BLOCK_BYTES + 1,
                               3 * frames.RAW_BLOCK_BYTES + 17])
def test_stored_frame_is_a_zstd_frame_of_exactly_its_data(n):
    data = incompressible(n)
    frame = frame_bytes(frames.stored_frame(memoryview(data)))
    assert len(frame) == frames.stored_frame_size(n)
    assert zstandard.ZstdDecompressor().decompressobj().decompress(frame) == data
    params = zstandard.get_frame_parameters(frame)
    assert params.has_checksum and params.window_size == frames.RAW_BLOCK_BYTES


def test_stored_frame_checksum_is_checked_by_zstd():
    data = bytearray(frame_bytes(frames.stored_frame(memoryview(incompressible(5000)))))
    data[100] ^= 1
    with pytest.raises(zstandard.ZstdError, match="checksum"):
        zstandard.ZstdDecompressor().decompressobj().decompress(bytes(data))


def _file_with(tmp_path, frame: bytes, lead: bytes = b"x" * 7):
    path = tmp_path / "frame.bin"
    path.write_bytes(lead + frame)
    return os.open(path, os.O_RDONLY), len(lead)


def test_read_stored_frame_fills_the_destination_and_checks_the_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(frames, "_IOV_MAX", 5)  # several preadv calls, as for 64 MiB frames
    data = incompressible(5 * frames.RAW_BLOCK_BYTES + 3)
    frame = frame_bytes(frames.stored_frame(memoryview(data)))
    fd, at = _file_with(tmp_path, frame)
    try:
        dest = bytearray(len(data))
        assert frames.read_stored_frame(fd, at, memoryview(dest)) is True
        assert dest == data
    finally:
        os.close(fd)
    bad = bytearray(frame)
    bad[len(frames.STORED_HEADER) + 3 + 10] ^= 1  # a data byte of the first block
    fd, at = _file_with(tmp_path, bytes(bad))
    try:
        with pytest.raises(reproarchive.errors.CorruptArchiveError, match="checksum"):
            frames.read_stored_frame(fd, at, memoryview(bytearray(len(data))))
    finally:
        os.close(fd)


def test_read_stored_frame_leaves_other_frames_to_zstd(tmp_path):
    """Same size, valid zstd, but not laid out as the writer lays stored frames out."""
    data = incompressible(2 * frames.RAW_BLOCK_BYTES)
    frame = bytearray(frame_bytes(frames.stored_frame(memoryview(data))))
    frame[5] = 8 << 3  # a larger window: still a valid frame with the same size
    assert zstandard.ZstdDecompressor().decompressobj().decompress(bytes(frame)) == data
    fd, at = _file_with(tmp_path, bytes(frame))
    try:
        assert frames.read_stored_frame(fd, at, memoryview(bytearray(len(data)))) is False
    finally:
        os.close(fd)


def test_encoder_stores_only_large_frames_that_barely_compress():
    enc = frames.FrameEncoder(level=1, min_saving=frames.MIN_SAVING)
    big = frames.PROBE_MIN_BYTES
    noise = memoryview(incompressible(big))
    weights = memoryview(bytes((torch.randn(big // 4, generator=torch.Generator().manual_seed(0)) * 0.02)
                               .view(torch.uint8).tolist()))
    ramp = memoryview(bytes((torch.arange(big // 8, dtype=torch.int64) % 1000).view(torch.uint8).tolist()))
    stored = frame_bytes(frames.stored_frame(noise))
    assert frame_bytes(enc.encode(noise, probe=True)) == stored
    assert frame_bytes(enc.encode(weights, probe=True)) == frame_bytes(frames.stored_frame(weights))  # saves ~8%
    compressed = frame_bytes(enc.encode(ramp, probe=True))
    assert len(compressed) < big // 2 and zstandard.ZstdDecompressor().decompressobj().decompress(compressed) == ramp
    # headers and the index are never probed; small frames are always compressed
    assert frame_bytes(enc.encode(noise, probe=False)) != stored
    assert frame_bytes(enc.encode(noise[: big - 1], probe=True)) != frame_bytes(frames.stored_frame(noise[: big - 1]))
    # min_saving=0 compresses every frame
    assert frame_bytes(frames.FrameEncoder(level=1, min_saving=0.0).encode(noise, probe=True)) != stored


def test_archives_with_stored_frames_load_verify_and_keep_random_access(tmp_path):
    gen = torch.Generator().manual_seed(1)
    weights = torch.randn(3 << 18, generator=gen) * 0.02  # 3 MiB: stored frames
    ramp = torch.arange(1 << 18, dtype=torch.int64)  # 2 MiB: compressed frames
    path = reproarchive.pack(graph(2), [weights, ramp], tmp_path / "s.tar.zst", frame_size=1 << 20)
    with reader.ContainerReader(path) as r:
        stored = [c == frames.stored_frame_size(d) for c, d in r.frames]
        assert any(stored) and not all(stored)
    assert reproarchive.verify(path).blobs == 2
    repro = reproarchive.load(path)
    assert torch.equal(repro.args[0], weights) and torch.equal(repro.args[1], ramp)
    assert torch.equal(reproarchive._internal.read_input(path, 0), weights)
    # compressing every frame gives a smaller file with the same contents
    small = reproarchive.pack(graph(2), [weights, ramp], tmp_path / "c.tar.zst", frame_size=1 << 20, min_saving=0.0)
    assert small.stat().st_size < path.stat().st_size
    with reader.ContainerReader(small) as a, reader.ContainerReader(path) as b:
        assert a.index_digest == b.index_digest  # the same index: frame encodings are not recorded


def test_a_reader_without_the_stored_frame_path_reads_the_same(monkeypatch):
    """What a format-1.0 reader that knows nothing of stored frames does: zstd decodes them."""
    from pathlib import Path

    vector = Path(__file__).resolve().parents[2] / "spec" / "vectors" / "stored-1.0.tar.zst"
    fast = reproarchive.load(vector).args
    monkeypatch.setattr(reader, "read_stored_frame", lambda *a: False)
    slow = reproarchive.load(vector).args
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert reproarchive.verify(vector).blobs == 2

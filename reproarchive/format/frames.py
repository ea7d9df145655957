"""One data frame's bytes: zstd-compressed, or stored in raw blocks when zstd would barely help.

Float weights are close to incompressible: zstd level 1 shrinks fp32 and fp16 weights by about
8% and bf16 weights by about 22%, all of it Huffman coding of the exponent bytes, and that
costs more CPU than hashing them (measured on the 2-core VM of benchmarks/README.md: ~1.6-2.2
CPU-s per GiB to compress and ~1.2-1.6 to decompress, against ~0.2 each way for raw blocks).
So the writer first asks zstd about a few small samples of each large data frame, and stores
the frame when they shrink by less than ``MIN_SAVING`` (a quarter): zstd then pays off only
where it saves more than sending the saved bytes over a ~1 Gbit/s link would cost, per core.

A stored frame is an ordinary zstd frame (RFC 8878) made of raw blocks, with the content
checksum every frame of the format carries, so every zstd decoder reads it and archives with
stored frames are plain format-1.0 archives (spec §2, rule 5). Its bytes depend only on the
data, so it is built here instead of by zstd (which would first search the data for matches
and copy it twice): a 6-byte header, a 3-byte header per 128 KiB block, the block bytes as
views of the caller's buffer (the file writer copies them once, into the file), and the low
32 bits of the data's XXH64. A reader can read such a frame straight into its destination.
"""

from __future__ import annotations

import os
import struct

import xxhash
import zstandard

from reproarchive.errors import CorruptArchiveError
from reproarchive.format.layout import ZSTD_MAGIC

# Frames shorter than this are always compressed: their cost is negligible, and small
# archives (the golden vectors among them) keep the bytes of the original writer.
PROBE_MIN_BYTES = 256 << 10
# Samples a frame is judged by: 4 x 16 KiB spread over the frame (1.6% of a 4 MiB frame).
# Measured against whole 4 MiB frames, the samples' ratio is within 0.6% for fp32, fp16 and
# bf16 weights, int64 indices, sparse and random data.
PROBE_SAMPLES = 4
PROBE_SAMPLE_BYTES = 16 << 10
# Store a frame when zstd would save less than this fraction of it (0: compress every frame).
MIN_SAVING = 0.25

RAW_BLOCK_BYTES = 128 << 10  # the zstd block size limit
# Frame header: magic, descriptor 0x04 (content checksum; no content size, no dictionary, not
# single-segment), window descriptor 7 << 3 (2**(10+7) = 128 KiB, what raw blocks need).
STORED_HEADER = struct.pack("<IBB", ZSTD_MAGIC, 0x04, 7 << 3)
_U32 = struct.Struct("<I")
_IOV_MAX = 1024


def _block_header(size: int, last: bool) -> bytes:
    return _U32.pack((size << 3) | int(last))[:3]  # last-block bit, block type 0 (raw), size


def stored_frame(data: memoryview) -> list:
    """The chunks of one zstd frame holding ``data`` in raw blocks (``data`` is not copied)."""
    data = memoryview(data).cast("B")
    n = len(data)
    if n == 0:
        raise ValueError("a stored frame holds at least one byte")
    chunks: list = [STORED_HEADER]
    for start in range(0, n, RAW_BLOCK_BYTES):
        size = min(RAW_BLOCK_BYTES, n - start)
        chunks.append(_block_header(size, start + size == n))
        chunks.append(data[start : start + size])
    chunks.append(_U32.pack(xxhash.xxh64_intdigest(data) & 0xFFFFFFFF))
    return chunks


def stored_frame_size(n: int) -> int:
    """Compressed size of the stored frame of ``n`` (> 0) bytes."""
    return len(STORED_HEADER) + 3 * -(-n // RAW_BLOCK_BYTES) + n + 4


def read_stored_frame(fd: int, offset: int, dest: memoryview) -> bool:
    """Read a stored frame of ``len(dest)`` bytes at ``offset`` straight into ``dest``.

    One ``preadv`` puts the block bytes where they belong and the headers aside, so the data
    is copied once, from the page cache into ``dest``. Returns False, leaving ``dest`` to be
    overwritten, when the bytes there are not laid out exactly as ``stored_frame`` writes them
    (the caller then decodes the frame with zstd, which checks any other valid frame); raises
    CorruptArchiveError when they are but the content checksum does not match.
    """
    n = len(dest)
    heads = [bytearray(len(STORED_HEADER) + 3)] + [bytearray(3) for _ in range(1, -(-n // RAW_BLOCK_BYTES))]
    tail = bytearray(4)
    iov: list = []
    for k, start in enumerate(range(0, n, RAW_BLOCK_BYTES)):
        iov += [heads[k], dest[start : start + RAW_BLOCK_BYTES]]
    iov.append(tail)
    got = 0
    for i in range(0, len(iov), _IOV_MAX):
        part = iov[i : i + _IOV_MAX]
        want = sum(len(b) for b in part)
        if os.preadv(fd, part, offset + got) != want:
            return False
        got += want
    if heads[0][: len(STORED_HEADER)] != STORED_HEADER:
        return False
    for k, start in enumerate(range(0, n, RAW_BLOCK_BYTES)):
        size = min(RAW_BLOCK_BYTES, n - start)
        if heads[k][-3:] != _block_header(size, start + size == n):
            return False
    if _U32.unpack(tail)[0] != xxhash.xxh64_intdigest(dest) & 0xFFFFFFFF:
        raise CorruptArchiveError("a stored frame fails its content checksum", "the archive is damaged; copy it again")
    return True


class FrameEncoder:
    """Encodes frames on one thread (each thread of a writer has its own).

    Small frames (tar headers, the index, small members) go through exactly the calls a single
    zstd stream makes (``write`` then ``flush(FLUSH_FRAME)`` on a ``stream_writer``); large data
    frames are probed, then stored or compressed in one call. Neither depends on how many
    encoders share the work, so the archive's bytes do not depend on the thread count.
    """

    def __init__(self, level: int, min_saving: float):
        self._sink = _ChunkSink()
        stream = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=False)
        self._stream = stream.stream_writer(self._sink, closefd=False, write_return_read=True)
        self._whole = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=False)
        self._probe = zstandard.ZstdCompressor(level=level, write_checksum=False, write_content_size=False)
        self._min_saving = min_saving

    def encode(self, data: memoryview, *, probe: bool) -> list:
        """The chunks of one frame holding ``data``; ``probe``: a data frame that may be stored."""
        if probe and len(data) >= PROBE_MIN_BYTES:
            if self._min_saving > 0 and self._barely_compresses(data):
                return stored_frame(data)
            # one call over the whole frame: zstd reads it in place instead of through its window
            return [self._whole.compress(data)]
        self._sink.chunks = []
        self._stream.write(data)
        self._stream.flush(zstandard.FLUSH_FRAME)
        return self._sink.chunks

    def _barely_compresses(self, data: memoryview) -> bool:
        step = len(data) // PROBE_SAMPLES
        took = given = 0
        for k in range(PROBE_SAMPLES):
            sample = data[k * step : k * step + PROBE_SAMPLE_BYTES]
            given += len(sample)
            took += len(self._probe.compress(sample))
        return took > (1.0 - self._min_saving) * given


class _ChunkSink:
    """Collects what a zstd stream_writer emits for one frame (the writer thread writes it)."""

    chunks: list

    def write(self, data) -> int:
        self.chunks.append(data)
        return len(data)

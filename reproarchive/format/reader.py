"""The byte layer of format 1: a member-aligned, multi-frame ``.tar.zst`` (spec/FORMAT.md §2–§5).

Any zstd + tar pair extracts the file, because it is an ordinary tar stream compressed as a
sequence of zstd frames. What makes it more than a tarball: every tar header and every chunk
of member data is its own frame, an index member lists each member's frames, and two zstd
skippable frames at the end (our footer and a zstd seekable-format seek table) let a reader
find the index with one read from the end and then decompress exactly the frames of the one
member it wants. The layer knows nothing about torch: it moves named byte strings.

Every rule a reader checks is written in the spec (§5, each with its rule id, which every
refusal names) and enforced here and in ``schema.rules`` before any member is decompressed, so
a damaged or hostile file is rejected early, with the work bounded by the declared (and
capped) sizes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
from typing import Callable, Iterator

import zstandard

from reproarchive.errors import (
    CorruptArchiveError,
    IndexSchemaError,
    LimitExceededError,
    NotAnArchiveError,
    Rule,
    TruncatedArchiveError,
    UnsupportedVersionError,
)
from reproarchive.format.frames import read_stored_frame, stored_frame_size
from reproarchive.format.layout import (
    DEFAULT_LIMITS,
    FOOTER_FRAME_MAGIC,
    FOOTER_FRAME_SIZE,
    FOOTER_STRUCT,
    FOOTER_TAG,
    INDEX_MEMBER,
    LAYOUT_MEMBER,
    MAX_WINDOW_SIZE,
    SEEK_ENTRY,
    SEEK_FOOTER,
    SEEK_TABLE_MAGIC,
    SEEKABLE_MAGIC,
    SKIPPABLE_HEADER,
    TAR_BLOCK,
    TAR_EOF,
    ZSTD_MAGIC,
    Limits,
    compress_bound,
    tar_header,
)
from reproarchive.format.schema import FORMAT_MAJOR, FORMAT_MINOR, Index
from reproarchive.format.schema.rules import decode_index

# --------------------------------------------------------------------------------------------
# Reading


@dataclasses.dataclass(frozen=True)
class Member:
    name: str
    size: int
    first_frame: int
    frames: int
    offset: int  # compressed offset of the first data frame
    compressed: int  # compressed bytes of the data frames


class _Window:
    """A read-only file view of [offset, offset+length) that never reads outside it."""

    def __init__(self, fd: int, offset: int, length: int):
        self._fd, self._pos, self._end = fd, offset, offset + length

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._end - self._pos
        n = min(n, self._end - self._pos)
        if n <= 0:
            return b""
        data = os.pread(self._fd, n, self._pos)
        self._pos += len(data)
        return data


class ContainerReader:
    """Opens an archive, checks every structural rule of spec §5, and reads members on demand."""

    def __init__(self, path: str | os.PathLike, *, limits: Limits = DEFAULT_LIMITS):
        self.path = os.fspath(path)
        self.limits = limits
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except IsADirectoryError:
            raise NotAnArchiveError(f"{self.path} is a directory, not an archive", rule=Rule.NOT_AN_ARCHIVE) from None
        try:
            self.file_size = os.fstat(self._fd).st_size
            self._frame_buffer = bytearray()
            self._dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_SIZE)
            self._read_tail()
            self._read_index()
            self._check_layout()
        except BaseException:
            os.close(self._fd)
            raise

    # -- context manager
    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- structure
    def _pread(self, n: int, offset: int) -> bytes:
        data = os.pread(self._fd, n, offset)
        if len(data) != n:
            raise TruncatedArchiveError(f"file ends at {self.file_size} bytes, inside a structure it declares",
                                        rule=Rule.SEEK_TABLE)
        return data

    def _not_ours(self, why: str, rule: Rule):
        head = os.pread(self._fd, 4, 0)
        if self.file_size == 0:
            return NotAnArchiveError(f"{self.path} is empty", "pack the failure again; an empty file holds nothing",
                                     rule=rule)
        if len(head) == 4 and struct.unpack("<I", head)[0] == ZSTD_MAGIC:
            if self._starts_like_ours():
                extra = self._trailing_bytes()
                if extra:
                    return CorruptArchiveError(
                        f"{self.path} has {extra} unexpected bytes after the end of the archive",
                        "something was appended to the file; copy or download it again", rule=rule,
                    )
                return TruncatedArchiveError(
                    f"{self.path} is a truncated reproarchive ({self.file_size} bytes; its end with the index is "
                    "missing)",
                    "copy or download the archive again", rule=rule,
                )
            return NotAnArchiveError(
                f"{self.path} is a zstd file but not a reproarchive ({why})",
                "extract it with `zstd -dc FILE | tar -x`, or pack the failure with `reproarchive pack`", rule=rule,
            )
        return NotAnArchiveError(f"{self.path} is not a reproarchive ({why})",
                                 "check the file name; expected a .tar.zst written by reproarchive", rule=rule)

    def _starts_like_ours(self) -> bool:
        # Our first frame is exactly the layout member's tar header: a tar.zst written by tar
        # or tarfile (one frame for everything) does not look truncated just because its
        # first member has that name.
        try:
            reader = self._dctx.stream_reader(_Window(self._fd, 0, min(self.file_size, 1 << 16)),
                                              read_across_frames=False)
            head = reader.read(TAR_BLOCK + 1)
        except zstandard.ZstdError:
            return False
        return len(head) == TAR_BLOCK and head[: len(LAYOUT_MEMBER) + 1] == LAYOUT_MEMBER.encode() + b"\0"

    def _trailing_bytes(self) -> int:
        """Bytes after the last seekable magic in the file's final MiB (0 when none is found)."""
        span = min(self.file_size, 1 << 20)
        tail = os.pread(self._fd, span, self.file_size - span)
        pos = tail.rfind(struct.pack("<I", SEEKABLE_MAGIC))
        return 0 if pos < 0 else span - pos - 4

    def _read_tail(self) -> None:
        size = self.file_size
        if size < FOOTER_FRAME_SIZE + SKIPPABLE_HEADER.size + SEEK_FOOTER.size:
            raise self._not_ours(f"only {size} bytes", Rule.NOT_AN_ARCHIVE)
        nframes, footer_start = self._read_seek_table(size)
        index_frame, index_size, index_sha = self._read_footer(footer_start)
        self._set_frame_offsets(footer_start)
        if index_frame >= nframes:
            raise CorruptArchiveError("footer points to an index frame that does not exist", "the archive is damaged",
                                      rule=Rule.INDEX_FRAME)
        if index_size > self.limits.max_index_bytes:
            raise LimitExceededError(f"index declares {index_size} bytes, more than the limit "
                                     f"{self.limits.max_index_bytes}", rule=Rule.INDEX_FRAME)
        if self.frames[index_frame][1] != index_size:
            raise CorruptArchiveError("footer and seek table disagree on the index size", "the archive is damaged",
                                      rule=Rule.INDEX_FRAME)
        self._index_frame, self._index_size, self._index_sha = index_frame, index_size, index_sha

    def _read_seek_table(self, size: int) -> tuple[int, int]:
        """(frames, where the footer frame starts): the seek table is read from the end, so its
        declared length is checked against the file before anything is read through it."""
        nframes, descriptor, magic = SEEK_FOOTER.unpack(self._pread(SEEK_FOOTER.size, size - SEEK_FOOTER.size))
        if magic != SEEKABLE_MAGIC:
            raise self._not_ours("no zstd seek table at its end", Rule.NOT_AN_ARCHIVE)
        if descriptor != 0:
            raise CorruptArchiveError(f"seek table descriptor is {descriptor:#x}, format 1 requires 0",
                                      "the archive is damaged", rule=Rule.SEEK_TABLE)
        if nframes > self.limits.max_frames:
            raise LimitExceededError(f"archive declares {nframes} frames, more than the limit {self.limits.max_frames}",
                                     rule=Rule.SEEK_TABLE)
        table_len = nframes * SEEK_ENTRY.size + SEEK_FOOTER.size
        table_start = size - table_len - SKIPPABLE_HEADER.size
        footer_start = table_start - FOOTER_FRAME_SIZE
        if footer_start < 0:
            raise TruncatedArchiveError(f"seek table declares {nframes} frames but the file has only {size} bytes",
                                        rule=Rule.SEEK_TABLE)
        magic, length = SKIPPABLE_HEADER.unpack(self._pread(SKIPPABLE_HEADER.size, table_start))
        if magic != SEEK_TABLE_MAGIC or length != table_len:
            raise CorruptArchiveError("seek table frame header is damaged", "the archive is damaged; copy it again",
                                      rule=Rule.SEEK_TABLE)
        raw = self._pread(nframes * SEEK_ENTRY.size, table_start + SKIPPABLE_HEADER.size)
        self.frames = list(SEEK_ENTRY.iter_unpack(raw))
        return nframes, footer_start

    def _read_footer(self, footer_start: int) -> tuple[int, int, bytes]:
        """(index frame, index size, index sha256); a format this reader cannot read is told
        apart from a damaged footer, so the user knows whether to upgrade."""
        magic, length = SKIPPABLE_HEADER.unpack(self._pread(SKIPPABLE_HEADER.size, footer_start))
        if magic != FOOTER_FRAME_MAGIC or length != FOOTER_STRUCT.size:
            raise self._not_ours("no reproarchive footer before the seek table", Rule.SEEK_TABLE)
        tag, major, minor, _reserved, index_frame, index_size, index_sha = FOOTER_STRUCT.unpack(
            self._pread(FOOTER_STRUCT.size, footer_start + SKIPPABLE_HEADER.size)
        )
        if tag != FOOTER_TAG:
            raise self._not_ours("footer tag mismatch", Rule.SEEK_TABLE)
        if major != FORMAT_MAJOR:
            if major > FORMAT_MAJOR:
                raise UnsupportedVersionError(
                    f"this archive is format {major}.{minor}; this reproarchive reads format {FORMAT_MAJOR}.x",
                    "this archive needs a newer reproarchive: pip install -U reproarchive", rule=Rule.VERSION,
                )
            raise UnsupportedVersionError(f"archive declares format {major}.{minor}, which never existed",
                                          "the archive is damaged", rule=Rule.VERSION)
        if _reserved and minor <= FORMAT_MINOR:
            raise CorruptArchiveError(
                f"footer reserved field is {_reserved:#x}; format {major}.{minor} requires 0",
                "the archive is damaged or was modified",
                rule=Rule.VERSION,
            )
        self.version = (major, minor)
        return index_frame, index_size, index_sha

    def _set_frame_offsets(self, footer_start: int) -> None:
        """Each frame's offset; the frames must fill the file up to the footer exactly, so no
        byte of an archive goes unchecked."""
        offsets = []
        pos = 0
        for c, _d in self.frames:
            offsets.append(pos)
            pos += c
        if pos != footer_start:
            if pos > footer_start:
                raise CorruptArchiveError(
                    f"seek table declares {pos} bytes of frames but only {footer_start} precede the footer",
                    "the archive is truncated or damaged", rule=Rule.FRAME_OFFSETS,
                )
            raise CorruptArchiveError(
                f"{footer_start - pos} unexplained bytes between the last frame and the footer",
                "the archive is damaged or was modified", rule=Rule.FRAME_OFFSETS,
            )
        self.frame_offsets = offsets

    def _read_index(self) -> None:
        buf = bytearray(self._index_size)
        self._decompress_into(self._index_frame, 1, memoryview(buf), what="the index")
        digest = hashlib.sha256(buf).digest()
        if digest != self._index_sha:
            raise CorruptArchiveError("the index does not match the digest in the footer",
                                      "the archive is damaged; copy it again", rule=Rule.INDEX_FRAME)
        self.index_digest = "sha256:" + digest.hex()
        self.index: Index = decode_index(bytes(buf), self.limits, self.version)

    def _check_layout(self) -> None:
        """Walk the frame table against the member list: every frame must be explained.

        The member list itself (names, counts, sizes) was checked when the index was decoded;
        this is the geometry of spec §2 and §5 rule 7-8.
        """
        container = self.index.container
        frame_size = container.frame_size
        members: dict[str, Member] = {}
        cursor = 0
        pad = 0
        nframes = len(self.frames)

        def expect_frame(d: int, what: str) -> None:
            if cursor >= nframes or self.frames[cursor][1] != d:
                raise CorruptArchiveError(f"frame {cursor} does not hold {what} as the index says",
                                          "the archive is damaged", rule=Rule.MEMBERS)

        for m in (*container.members, None):
            if m is None:
                name, size, first, count = INDEX_MEMBER, self._index_size, self._index_frame, 1
            else:
                name, size, first, count = m.name, m.size, m.first_frame, m.frames
                expected_count = -(-size // frame_size)
                if count != expected_count:
                    raise CorruptArchiveError(f"member {name!r} declares {count} frames; {size} bytes need "
                                              f"{expected_count}", rule=Rule.MEMBERS)
            expect_frame(pad + len(tar_header(name, size)), f"the tar header of {name!r}")
            cursor += 1
            if first != cursor:
                raise CorruptArchiveError(f"member {name!r} starts at frame {first}, expected {cursor}",
                                          "the archive is damaged", rule=Rule.MEMBERS)
            if m is None:
                if size == 0:
                    raise CorruptArchiveError("the index is empty", rule=Rule.MEMBERS)
                cursor += 1
            else:
                left = size
                for _ in range(count):
                    expect_frame(min(left, frame_size), f"data of {name!r}")
                    left -= min(left, frame_size)
                    cursor += 1
            compressed_end = self.frame_offsets[cursor] if cursor < nframes else None
            if compressed_end is None:
                raise CorruptArchiveError("the tar end frame is missing", "the archive is damaged", rule=Rule.MEMBERS)
            start = self.frame_offsets[first] if count else compressed_end
            for c, d in self.frames[first : first + count]:
                if c < 9 or c > compress_bound(d):
                    raise CorruptArchiveError(
                        f"a frame of {name!r} has an impossible compressed size {c} for {d} bytes",
                        rule=Rule.FRAME_SIZES)
            if m is not None:
                members[name] = Member(name, size, first, count, start, compressed_end - start)
            pad = (-size) % TAR_BLOCK
        expect_frame(pad + TAR_EOF, "the tar end")
        if cursor + 1 != nframes:
            raise CorruptArchiveError(f"{nframes - cursor - 1} frames after the tar end",
                                      "the archive is damaged or was modified", rule=Rule.MEMBERS)
        self.frame_size = frame_size
        self.members = members

    # -- member access
    def _decompress_into(self, first: int, count: int, dest: memoryview, *, what: str) -> None:
        """Decompress frames [first, first+count) into ``dest``, which must be filled exactly.

        The source window is cut to those frames' compressed bytes and the output is the
        caller's buffer, so neither a lying seek table nor a bomb can make us read or write
        more than the declared sizes.
        """
        if count == 0:
            if len(dest):
                raise CorruptArchiveError(f"{what} has no data frames but declares {len(dest)} bytes",
                                          rule=Rule.MEMBER_DATA)
            return
        declared = sum(d for _, d in self.frames[first : first + count])
        if declared != len(dest):
            raise CorruptArchiveError(f"{what} declares {len(dest)} bytes but its frames hold {declared}",
                                      "the archive is damaged", rule=Rule.MEMBER_DATA)
        got = 0
        try:
            for i in range(first, first + count):
                c, d = self.frames[i]
                if c == stored_frame_size(d) and read_stored_frame(
                        self._fd, self.frame_offsets[i], dest[got : got + d]):
                    got += d
                    continue
                src = self._read_frame(i)
                # across frames: bytes after this frame's end would start another frame, and fail
                reader = self._dctx.stream_reader(src, read_across_frames=True)
                end = got + d
                while got < end:
                    n = reader.readinto(dest[got:end])
                    if not n:
                        raise CorruptArchiveError(f"{what} decompresses to {got} bytes, fewer than the {len(dest)} "
                                                  "declared", "the archive is damaged", rule=Rule.MEMBER_DATA)
                    got += n
                if reader.read(1):
                    raise CorruptArchiveError(f"{what} decompresses to more than the {len(dest)} bytes declared",
                                              "the archive is damaged or hostile", rule=Rule.MEMBER_DATA)
        except zstandard.ZstdError as exc:
            raise CorruptArchiveError(f"{what} is damaged: zstd says {str(exc)[:160]}", "copy the archive again",
                                      rule=Rule.MEMBER_DATA) from exc

    def _read_frame(self, i: int) -> memoryview:
        """Frame ``i``'s compressed bytes, read into a buffer this reader reuses (valid until the next call).

        Reading into the same memory every time, instead of a fresh bytes object per read,
        keeps the kernel's copy out of newly faulted pages (measured here: 0.3-0.7 CPU-s per
        GiB of archive in this VM).
        """
        c = self.frames[i][0]
        if len(self._frame_buffer) < c:
            self._frame_buffer = bytearray(c)
        view = memoryview(self._frame_buffer)[:c]
        n = os.preadv(self._fd, [view], self.frame_offsets[i])
        if n != c:
            raise TruncatedArchiveError(f"file ends at {self.file_size} bytes, inside frame {i}", rule=Rule.MEMBER_DATA)
        return view

    def member(self, name: str) -> Member:
        try:
            return self.members[name]
        except KeyError:
            raise IndexSchemaError(f"the index refers to member {name!r}, which the archive does not hold") from None

    def read_member(self, name: str) -> bytes:
        m = self.member(name)
        buf = bytearray(m.size)
        self._decompress_into(m.first_frame, m.frames, memoryview(buf), what=f"member {name!r}")
        return bytes(buf)

    def read_member_into(self, name: str, dest: memoryview) -> None:
        m = self.member(name)
        if len(dest) != m.size:
            raise ValueError(f"buffer of {len(dest)} bytes for member {name!r} of {m.size}")
        self._decompress_into(m.first_frame, m.frames, dest, what=f"member {name!r}")

    def iter_frames(self, progress: Callable[[int], None] | None = None) -> Iterator[tuple[int, memoryview]]:
        """Every frame's decompressed bytes in order, each checked against its declared size."""
        buf = bytearray(max(d for _, d in self.frames))
        view = memoryview(buf)
        for i, (_c, d) in enumerate(self.frames):
            self._decompress_into(i, 1, view[:d], what=f"frame {i}")
            yield i, view[:d]
            if progress:
                progress(d)

    def iter_member_chunks(self, name: str) -> Iterator[memoryview]:
        """A member's bytes, one frame at a time (bounded memory for unpack and hashing)."""
        m = self.member(name)
        buf = bytearray(self.frame_size)
        view = memoryview(buf)
        for i in range(m.first_frame, m.first_frame + m.frames):
            d = self.frames[i][1]
            self._decompress_into(i, 1, view[:d], what=f"member {name!r}")
            yield view[:d]

    def expected_frame_bytes(self) -> Iterator[tuple[int, bytes | str]]:
        """For verify: per frame, the exact bytes of structural frames, or the owning member's name."""
        pad = 0
        cursor = 0
        ordered = sorted(self.members.values(), key=lambda m: m.first_frame)
        entries = [(m.name, m.size, m.frames) for m in ordered] + [(INDEX_MEMBER, self._index_size, 1)]
        for name, size, count in entries:
            yield cursor, b"\0" * pad + tar_header(name, size)
            cursor += 1
            for _ in range(count):
                yield cursor, name
                cursor += 1
            pad = (-size) % TAR_BLOCK
        yield cursor, b"\0" * (pad + TAR_EOF)

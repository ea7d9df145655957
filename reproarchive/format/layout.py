"""The fixed facts of format 1's bytes (spec §2-§5): member names, frame sizes, magics, footer
and seek-table structs, tar headers and the reader's caps.

Writer and reader both take every constant from here, so the two cannot drift apart. The
format version lives with the records it versions, in ``schema``; the layout member that
repeats it is built here.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import tarfile

from reproarchive.errors import Rule, UnsafeArchiveError
from reproarchive.format.digests import ALGORITHMS
from reproarchive.format.schema import FORMAT_MAJOR, FORMAT_MINOR, FORMAT_NAME

LAYOUT_MEMBER = "reproarchive-layout"
INDEX_MEMBER = "index.msgpack"
GRAPH_CODE_MEMBER = "graph.py"  # the graph as readable Python, for people only (never executed)

DEFAULT_FRAME_SIZE = 4 << 20
MIN_FRAME_SIZE = 64 << 10
MAX_FRAME_SIZE = 64 << 20
DEFAULT_LEVEL = 1
MAX_LEVEL = 19  # levels 20-22 need windows above the reader's 8 MiB cap
MAX_WINDOW_SIZE = 8 << 20

ZSTD_MAGIC = 0xFD2FB528
FOOTER_FRAME_MAGIC = 0x184D2A50
SEEK_TABLE_MAGIC = 0x184D2A5E
SEEKABLE_MAGIC = 0x8F92EAB1
FOOTER_TAG = b"REPROARC"
SKIPPABLE_HEADER = struct.Struct("<II")
FOOTER_STRUCT = struct.Struct("<8sHHIQQ32s")  # tag, major, minor, reserved, index frame, index size, sha256
SEEK_ENTRY = struct.Struct("<II")
SEEK_FOOTER = struct.Struct("<IBI")
FOOTER_FRAME_SIZE = SKIPPABLE_HEADER.size + FOOTER_STRUCT.size
TAR_BLOCK = 512
TAR_EOF = 2 * TAR_BLOCK

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*(?:/[a-z0-9][a-z0-9_.-]*)*$")
_BLOB_NAME_RE = re.compile(rf"^blobs/({'|'.join(ALGORITHMS)})/[0-9a-f]{{64}}$")
MAX_NAME_LENGTH = 100


@dataclasses.dataclass(frozen=True)
class Limits:
    """Caps a reader enforces before it allocates or decompresses anything (spec §5)."""

    max_index_bytes: int = 64 << 20
    max_members: int = 1 << 18
    max_frames: int = 1 << 22
    max_total_bytes: int = 1 << 42  # 4 TiB of member data
    max_index_memory: int = 1 << 30  # estimated bytes of Python objects the decoded index may take
    max_nodes: int = 150_000  # graph nodes, subgraphs included: inspect/verify of the largest stay < 10 s


DEFAULT_LIMITS = Limits()


def check_member_name(name: object) -> str:
    """The member-name grammar: lowercase relative paths, no '.', '..' or empty segments."""
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH or not _NAME_RE.match(name):
        raise UnsafeArchiveError(
            f"member name {str(name)[:120]!r} is not allowed",
            "member names must be relative lowercase paths like blobs/sha256/<hex>; the archive is unsafe or damaged",
            rule=Rule.MEMBERS,
        )
    if any(seg in (".", "..") for seg in name.split("/")):
        raise UnsafeArchiveError(f"member name {name!r} contains a '.' or '..' segment", "the archive is unsafe",
                                 rule=Rule.MEMBERS)
    return name


def layout_member_bytes(major: int = FORMAT_MAJOR, minor: int = FORMAT_MINOR) -> bytes:
    """The ``reproarchive-layout`` member: the version, readable by people and by ``tar``."""
    return (json.dumps({"format": FORMAT_NAME, "version": f"{major}.{minor}"}, sort_keys=True) + "\n").encode()


def is_blob_name(name: str) -> bool:
    return bool(_BLOB_NAME_RE.match(name))


def tar_header(name: str, size: int) -> bytes:
    """The exact header bytes the spec fixes for a member: ustar (pax 'size' record past 8 GiB)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def compress_bound(size: int) -> int:
    """ZSTD_compressBound plus frame-header and checksum slack (spec §5)."""
    margin = ((128 << 10) - size) >> 11 if size < (128 << 10) else 0
    return size + (size >> 8) + margin + 64

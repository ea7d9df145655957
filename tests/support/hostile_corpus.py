"""A corpus of malformed and malicious archives, built from one small valid archive.

Importable (``generate(workdir, escape_root=...)`` returns ``Case`` objects with their bytes)
and runnable (``python tests/support/hostile_corpus.py OUTDIR`` writes every case as a file plus a
``MANIFEST.json`` saying what each one is and which operations must reject it).

Byte-level cases (truncation, bit flips, trailing bytes, wrong magics) mutate the valid
archive's bytes. Semantic cases go *past* the checksums: ``assemble`` rebuilds a complete,
self-consistent archive (frames, index, footer digest, seek table) from a member list and an
index, so the defect under test is the only thing wrong with it.

Expectations, per case, are the set of operations that MUST raise an ``ArchiveError``:

* ``ALL`` - every reader (verify, load, inspect, unpack, and so run/export/minify): the defect
  is in the footer, seek table, index or records, which every reader checks on open.
* ``FULL`` - only the operations that decompress and check every frame (verify, unpack). The
  defect is in bytes that load/inspect never read or do not rehash (a tar header frame, the
  readable ``graph.py``, a blob whose bytes do not hash to its name). load/inspect may accept
  such a file; they must still never crash, write, or execute anything.
* ``NONE`` - positive controls that every operation must accept (so the tests can fail).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import msgpack
import zstandard

from reproarchive.format import index_codec, layout, plain, schema
from reproarchive.format.layout import (
    FOOTER_FRAME_MAGIC,
    FOOTER_TAG,
    INDEX_MEMBER,
    LAYOUT_MEMBER,
    SEEK_TABLE_MAGIC,
    SEEKABLE_MAGIC,
    TAR_BLOCK,
    TAR_EOF,
)
from reproarchive.format.reader import ContainerReader

ROOT = Path(__file__).resolve().parents[2]

LIB_OPS = ("verify", "load", "inspect", "unpack")
ALL = frozenset(LIB_OPS)
FULL = frozenset({"verify", "unpack"})
NONE: frozenset = frozenset()

FOOTER_STRUCT = struct.Struct("<8sHHIQQ32s")
_SKIP = struct.Struct("<II")
SEEK_ENTRY = struct.Struct("<II")
SEEK_FOOTER = struct.Struct("<IBI")


@dataclasses.dataclass
class Case:
    name: str
    category: str
    data: bytes
    reject: frozenset = ALL
    errors: tuple[str, ...] = ("ArchiveError",)  # acceptable error class names when rejected
    note: str = ""
    heavy: bool = False  # a bomb: run it under an address-space limit in a child process
    markers: tuple[str, ...] = ()  # paths that must never exist after any operation
    limits: dict | None = None  # Limits overrides for the library calls
    same_content: bool = False  # if accepted, the content must equal the valid archive's

    def manifest(self) -> dict:
        return {
            "name": self.name, "category": self.category, "bytes": len(self.data),
            "must_reject": sorted(self.reject), "errors": list(self.errors), "note": self.note,
            "heavy": self.heavy, "markers": list(self.markers), "limits": self.limits,
        }


# --------------------------------------------------------------------------------------------
# the valid archive


def make_graph():
    """A small graph with a stored submodule (parameters), a call_method and an int input."""
    import torch
    import torch.fx as fx

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x, n):
            return torch.relu(self.lin(x)).sum(1) * n

    torch.manual_seed(0)
    gm = fx.symbolic_trace(M())
    return gm, [torch.randn(2, 4), 3]


def make_valid(path: str | os.PathLike, **kwargs) -> Path:
    import reproarchive

    gm, inputs = make_graph()
    kwargs.setdefault("backend", "eager")
    return reproarchive.pack(gm, inputs, path, progress=False, snapshot=False, **kwargs)


# --------------------------------------------------------------------------------------------
# parsing and re-assembling


@dataclasses.dataclass
class Parsed:
    index: dict
    members: list[tuple[str, bytes]]  # in archive order, index member excluded
    frames: list[tuple[int, int]]
    frame_offsets: list[int]
    footer_start: int
    table_start: int
    index_frame: int
    member_frames: dict[str, tuple[int, int]]  # name -> (first data frame, count)
    frame_size: int


def parse(data: bytes) -> Parsed:
    with tempfile.NamedTemporaryFile(suffix=".tar.zst") as f:
        f.write(data)
        f.flush()
        with ContainerReader(f.name) as r:
            ordered = sorted(r.members.values(), key=lambda m: m.first_frame)
            members = [(m.name, r.read_member(m.name)) for m in ordered]
            nframes = len(r.frames)
            table_start = len(data) - (nframes * 8 + 9) - 8
            return Parsed(
                index=plain.to_plain(r.index), members=members, frames=list(r.frames),
                frame_offsets=list(r.frame_offsets),
                footer_start=table_start - layout.FOOTER_FRAME_SIZE, table_start=table_start,
                index_frame=r._index_frame, member_frames={m.name: (m.first_frame, m.frames) for m in ordered},
                frame_size=r.frame_size,
            )


_CCTX = zstandard.ZstdCompressor(level=1, write_checksum=True, write_content_size=False)


def assemble(
    members: list[tuple[str, bytes]],
    index: dict | None,
    *,
    index_bytes: bytes | None = None,
    frame_size: int = layout.DEFAULT_FRAME_SIZE,
    major: int = schema.FORMAT_MAJOR,
    minor: int = schema.FORMAT_MINOR,
    reserved: int = 0,
    headers: dict[str, bytes] | None = None,
    compressed: dict[int, bytes] | None = None,
    set_members: bool = True,
) -> bytes:
    """A complete archive whose frames, index digest, footer and seek table all agree.

    ``headers`` replaces a member's tar header bytes (same length: 512 for short names);
    ``compressed`` replaces frame N's compressed bytes while the seek table keeps the declared
    decompressed size (for decompression bombs); ``index_bytes`` writes a raw index.
    """
    headers = headers or {}
    frames: list[bytes] = []
    records = []
    pad = 0
    for name, data in members:
        frames.append(b"\0" * pad + headers.get(name, layout.tar_header(name, len(data))))
        first = len(frames)
        for off in range(0, len(data), frame_size):
            frames.append(data[off : off + frame_size])
        records.append({"name": name, "size": len(data), "first_frame": first, "frames": len(frames) - first})
        pad = (-len(data)) % TAR_BLOCK
    if index_bytes is None:
        index = dict(index)
        cont = dict(index.get("container") or {})
        if set_members:
            cont["members"] = records
        cont.setdefault("frame_size", frame_size)
        index["container"] = cont
        index_bytes = msgpack.packb(index_codec.canonical(index), use_bin_type=True)
    frames.append(b"\0" * pad + headers.get(INDEX_MEMBER, layout.tar_header(INDEX_MEMBER, len(index_bytes))))
    index_frame = len(frames)
    frames.append(index_bytes)
    frames.append(b"\0" * ((-len(index_bytes)) % TAR_BLOCK) + b"\0" * TAR_EOF)
    out = io.BytesIO()
    table = []
    for i, raw in enumerate(frames):
        comp = (compressed or {}).get(i)
        if comp is None:
            comp = _CCTX.compress(raw)
        out.write(comp)
        table.append((len(comp), len(raw)))
    footer = FOOTER_STRUCT.pack(FOOTER_TAG, major, minor, reserved, index_frame, len(index_bytes),
                                hashlib.sha256(index_bytes).digest())
    out.write(_SKIP.pack(FOOTER_FRAME_MAGIC, FOOTER_STRUCT.size) + footer)
    seek = b"".join(SEEK_ENTRY.pack(c, d) for c, d in table) + SEEK_FOOTER.pack(len(table), 0, SEEKABLE_MAGIC)
    out.write(_SKIP.pack(SEEK_TABLE_MAGIC, len(seek)) + seek)
    return out.getvalue()


def rebuild(p: Parsed, edit_index: Callable[[dict], Any] | None = None,
            edit_members: Callable[[list], Any] | None = None, **kwargs) -> bytes:
    """Re-assemble a parsed archive after editing a deep copy of its index and member list."""
    index = msgpack.unpackb(msgpack.packb(p.index))  # deep copy
    members = list(p.members)
    if edit_members:
        members = edit_members(members) or members
    if edit_index:
        edit_index(index)
    return assemble(members, index, frame_size=p.frame_size, **kwargs)


def _blob_names(p: Parsed) -> list[str]:
    return [n for n, _ in p.members if layout.is_blob_name(n)]


def _replace_member(members, name, data):
    return [(n, data if n == name else d) for n, d in members]


# --------------------------------------------------------------------------------------------
# case builders


def byte_cases(valid: bytes, p: Parsed, *, all_offsets: bool = True) -> list[Case]:
    """Truncations, bit flips, trailing and inserted bytes, wrong magics."""
    cases = []
    n = len(valid)
    offsets = range(n) if all_offsets else sorted(set(range(0, n, 7)) | set(range(max(0, n - 300), n)))
    for k in offsets:
        cases.append(Case(f"truncate_{k:06d}", "truncation", valid[:k], ALL,
                          ("NotAnArchiveError", "TruncatedArchiveError", "CorruptArchiveError"),
                          f"first {k} of {n} bytes"))

    regions: dict[str, list[int]] = {}
    for i, (c, _d) in enumerate(p.frames):
        start = p.frame_offsets[i]
        owner = "structure"
        for name, (first, count) in p.member_frames.items():
            if first <= i < first + count:
                owner = "blob" if layout.is_blob_name(name) else ("code" if name == "graph.py" else "member")
        if i == p.index_frame:
            owner = "index"
        if i == 0 or i == len(p.frames) - 1 or i == p.index_frame - 1:
            owner = owner if owner != "structure" else "tarheader"
        regions.setdefault(f"frame_{owner}", []).extend([start, start + 4, start + 5, start + c // 2, start + c - 1])
    regions["footer"] = list(range(p.footer_start, p.table_start, 5))
    regions["seektable"] = list(range(p.table_start, n, 3))
    for region, positions in regions.items():
        # Which readers see this region: the footer, seek table and index frame are read on
        # open; blobs by load; tar headers, padding and graph.py only by verify/unpack.
        if region in ("footer", "seektable", "frame_index"):
            reject = ALL
        elif region == "frame_blob":
            reject = frozenset({"verify", "unpack", "load"})
        else:
            reject = FULL
        for pos in sorted(set(positions)):
            for bit in (0, 3, 7):
                data = bytearray(valid)
                data[pos] ^= 1 << bit
                cases.append(Case(f"flip_{region}_{pos:06d}_b{bit}", f"bitflip_{region}", bytes(data), reject,
                                  note=f"bit {bit} of byte {pos}", same_content=True))
    # Bits zstd is specified to ignore (the frame header's unused bit) may flip undetected;
    # same_content=True lets an operation accept those, but only with the original content.

    cases.append(Case("trailing_bytes", "trailing", valid + b"garbage after the seek table\n", ALL))
    cases.append(Case("trailing_zero_block", "trailing", valid + b"\0" * 1024, ALL))
    cases.append(Case("trailing_copy", "trailing", valid + valid, ALL))
    mid = p.footer_start
    cases.append(Case("inserted_before_footer", "trailing", valid[:mid] + b"\0" * 16 + valid[mid:], ALL))
    cases.append(Case("leading_bytes", "trailing", b"\0" * 512 + valid, ALL))

    def patch(off: int, raw: bytes) -> bytes:
        b = bytearray(valid)
        b[off : off + len(raw)] = raw
        return bytes(b)

    cases.append(Case("magic_seekable", "magic", patch(n - 4, struct.pack("<I", 0x8F92EAB0)), ALL,
                      ("NotAnArchiveError", "TruncatedArchiveError")))
    cases.append(Case("magic_seektable_frame", "magic", patch(p.table_start, struct.pack("<I", 0x184D2A5F)), ALL))
    cases.append(Case("magic_footer_frame", "magic", patch(p.footer_start, struct.pack("<I", 0x184D2A51)), ALL))
    cases.append(Case("magic_footer_tag", "magic", patch(p.footer_start + 8, b"REPROARX"), ALL))
    cases.append(Case("magic_first_frame", "magic", patch(0, b"\x29\xb5\x2f\xfd"), FULL))
    cases.append(Case("magic_index_frame", "magic", patch(p.frame_offsets[p.index_frame], b"\x29\xb5\x2f\xfd"), ALL))
    cases.append(Case("footer_reserved_nonzero", "footer", patch(p.footer_start + 8 + 12, struct.pack("<I", 1)), ALL,
                      note="the reserved footer field of an archive of this minor must be zero"))
    cases.append(Case("footer_index_frame_oob", "footer", patch(p.footer_start + 8 + 16, struct.pack("<Q", 1 << 40)),
                      ALL))
    cases.append(Case("footer_index_size_huge", "footer", patch(p.footer_start + 8 + 24, struct.pack("<Q", 1 << 40)),
                      ALL))
    cases.append(Case("seek_descriptor", "seektable", patch(n - 5, b"\x80"), ALL))
    cases.append(Case("seek_nframes_huge", "seektable", patch(n - 9, struct.pack("<I", 0xFFFFFFFF)), ALL,
                      ("LimitExceededError", "TruncatedArchiveError", "CorruptArchiveError")))
    cases.append(Case("seek_nframes_off_by_one", "seektable", patch(n - 9, struct.pack("<I", len(p.frames) + 1)), ALL))
    # a seek table entry that moves bytes between two frames (sizes still add up)
    entry0 = p.table_start + 8
    c0, d0 = p.frames[0]
    c1, d1 = p.frames[1]
    shifted = patch(entry0, SEEK_ENTRY.pack(c0 + 1, d0) + SEEK_ENTRY.pack(c1 - 1, d1))
    cases.append(Case("seek_entry_shifted", "seektable", shifted, FULL))
    # decompressed size lie on a blob frame (sizes no longer match the index)
    bf = p.member_frames[_blob_names(p)[0]][0]
    cases.append(Case("seek_entry_blob_size", "seektable",
                      patch(entry0 + 8 * bf, SEEK_ENTRY.pack(p.frames[bf][0], p.frames[bf][1] + 1)), ALL))
    return cases


def container_cases(valid: bytes, p: Parsed) -> list[Case]:
    """Whole-file kinds: empty, random, other formats, versions, rebuilt round trip."""
    rng = random.Random(7)
    cases = [
        Case("empty", "notarchive", b"", ALL, ("NotAnArchiveError",)),
        Case("one_byte", "notarchive", b"\x28", ALL, ("NotAnArchiveError",)),
        Case("random_1k", "notarchive", rng.randbytes(1024), ALL, ("NotAnArchiveError",)),
        Case("random_100k", "notarchive", rng.randbytes(100_000), ALL, ("NotAnArchiveError",)),
        Case("text_file", "notarchive", b"#!/bin/sh\necho not an archive\n" * 10, ALL, ("NotAnArchiveError",)),
        Case("zeros_4k", "notarchive", b"\0" * 4096, ALL, ("NotAnArchiveError",)),
        Case("zstd_of_text", "notarchive", zstandard.ZstdCompressor().compress(b"hello" * 100), ALL,
             ("NotAnArchiveError",)),
        Case("zstd_of_archive", "notarchive", zstandard.ZstdCompressor().compress(valid), ALL, ("NotAnArchiveError",)),
        Case("seek_table_only", "notarchive", valid[p.table_start :], ALL),
        Case("footer_and_table_only", "notarchive", valid[p.footer_start :], ALL),
    ]
    # positive controls: our own re-assembly, and a newer minor with unknown fields
    cases.append(Case("control_rebuilt", "control", rebuild(p), NONE, note="assemble() of the valid archive"))

    def newer_minor(index):
        index["version"] = "1.9"
        index["future_section"] = {"anything": [1, 2, 3]}

    def newer_minor_members(members):
        newer = layout.layout_member_bytes(1, 9)
        members = _replace_member(members, LAYOUT_MEMBER, newer)
        return members + [("notes/readme.txt", b"a member a newer minor version added\n")]

    cases.append(Case("control_newer_minor", "control", rebuild(p, newer_minor, newer_minor_members, minor=9), NONE,
                      note="format 1.9 with an unknown section and an unknown member must be accepted"))

    def version(major, minor):
        def edit_index(index):
            index["version"] = f"{major}.{minor}"

        def edit_members(members):
            return _replace_member(members, LAYOUT_MEMBER, layout.layout_member_bytes(major, minor))

        return rebuild(p, edit_index, edit_members, major=major, minor=minor)

    cases.append(Case("version_major_2", "version", version(2, 0), ALL, ("UnsupportedVersionError",),
                      "footer, index and layout member all say 2.0"))
    cases.append(Case("version_major_0", "version", version(0, 7), ALL, ("UnsupportedVersionError",)))
    cases.append(Case("version_major_65535", "version", version(65535, 0), ALL, ("UnsupportedVersionError",)))
    other_minor = schema.FORMAT_MINOR + 1
    cases.append(Case("version_index_disagrees", "version",
                      rebuild(p, lambda i: i.update(version=f"{schema.FORMAT_MAJOR}.{other_minor}")), ALL))
    cases.append(Case("version_layout_disagrees", "version", rebuild(p, None, lambda m: _replace_member(
        m, LAYOUT_MEMBER, layout.layout_member_bytes(schema.FORMAT_MAJOR, other_minor))), FULL))
    cases.append(Case("format_name_wrong", "version", rebuild(p, lambda i: i.update(format="safetensors")), ALL))
    return cases


def _tar_bytes(entries: Iterable[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, None)
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(name: str, kind=tarfile.REGTYPE, size: int = 0, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.linkname = linkname
    info.mode = 0o644
    return info


def tar_cases(valid: bytes, p: Parsed, workdir: Path, escape_root: Path) -> list[Case]:
    """Ordinary tar.zst files (tar and Python), hostile plain tars, and hostile tar headers
    inside an otherwise well-formed container."""
    cases = []
    escape_abs = str(escape_root / "absolute_member")
    evil = [
        ("dotdot", _info("../escaped_dotdot", size=5), b"evil\n"),
        ("absolute", _info(escape_abs, size=5), b"evil\n"),
        ("symlink", _info("link", tarfile.SYMTYPE, linkname=str(escape_root)), None),
        ("symlink_then_write", _info("link2", tarfile.SYMTYPE, linkname=".."), None),
        ("hardlink", _info("hard", tarfile.LNKTYPE, linkname="/etc/passwd"), None),
        ("chardev", _info("dev", tarfile.CHRTYPE), None),
        ("fifo", _info("fifo", tarfile.FIFOTYPE), None),
        ("duplicate", _info("graph.py", size=3), b"one"),
    ]
    plain_members = []
    for label, info, data in evil:
        entries = [(_info("reproarchive-layout", size=len(layout.layout_member_bytes())), layout.layout_member_bytes())]
        entries.append((info, data) if data is not None else info)
        if label == "symlink_then_write":
            entries.append((_info("link2/escaped_via_symlink", size=5), b"evil\n"))
        if label == "duplicate":
            entries.append((_info("graph.py", size=3), b"two"))
        raw = _tar_bytes(entries)
        plain_members.append((label, raw))
        cases.append(Case(f"plaintar_{label}", "plaintar", zstandard.ZstdCompressor().compress(raw), ALL,
                          ("NotAnArchiveError",)))
    # python tarfile + zstandard of the unpacked valid archive
    py_tar = _tar_bytes([(_info(n, size=len(d)), d) for n, d in p.members])
    cases.append(Case("plaintar_python_zstd", "plaintar", zstandard.ZstdCompressor().compress(py_tar), ALL,
                      ("NotAnArchiveError",)))
    # GNU tar --zstd
    if shutil.which("tar") and shutil.which("zstd"):
        src = workdir / "tar_src"
        src.mkdir(parents=True, exist_ok=True)
        for name, data in p.members:
            target = src.joinpath(*name.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        out = workdir / "gnu.tar.zst"
        res = subprocess.run(["tar", "--zstd", "-cf", str(out), "-C", str(src), "."], capture_output=True)
        if res.returncode == 0:
            cases.append(Case("plaintar_gnu_tar_zstd", "plaintar", out.read_bytes(), ALL, ("NotAnArchiveError",)))
    # hostile tar headers inside a well-formed container (the index says regular files)
    code = "graph.py"
    size = len(dict(p.members)[code])

    def hdr(info: tarfile.TarInfo) -> bytes:
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        raw = info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")
        assert len(raw) == len(layout.tar_header(code, size)), "crafted header must keep the frame length"
        return raw

    for label, info in [
        ("dotdot", _info("../escaped_hdr", size=size)),
        ("absolute", _info(escape_abs, size=size)),
        ("symlink", _info(code, tarfile.SYMTYPE, size=size, linkname=str(escape_root))),
        ("hardlink", _info(code, tarfile.LNKTYPE, size=size, linkname="/etc/passwd")),
        ("chardev", _info(code, tarfile.CHRTYPE, size=size)),
        ("other_name", _info("graph2.py", size=size)),
    ]:
        cases.append(Case(f"tarheader_{label}", "tarheader", rebuild(p, headers={code: hdr(info)}), FULL,
                          note="crafted tar header frame; the index still lists a regular graph.py"))
    return cases


def _first_tensor_input(index: dict) -> dict:
    return next(r for r in index["inputs"] if r["kind"] == "tensor")


def _node(index, op):
    return next(n for n in index["graph"]["nodes"] if n["op"] == op)


#: (label, higher-order operator, the operator it is handed): none of them may be resolved or run
OPERATOR_ARGUMENTS = [
    ("os_system", "with_effects", "os.system"),
    ("builtins_eval", "auto_functionalized_v2", "builtins.eval"),
    ("dunder_import", "with_effects", "builtins.__import__"),
    ("not_an_operator", "with_effects", "torch.load"),
    ("effectful_print", "with_effects", "torch.ops.aten._print.default"),
    ("alias_torch_load", "auto_functionalized_v2", "torch._refs.torch.load"),
]
#: (label, class name) of a tensor subclass input torch does not define
SUBCLASS_CLASSES = [("os_system", "os.system"), ("unknown_module", "reproarchive_hostile_module.Evil"),
                    ("torch_private", "torch._C._TensorBase")]


def as_subclass(index: dict, cls: str) -> None:
    """Turn the archive's first tensor input into a (1.3) ``subclass`` value of class ``cls``
    whose two inner tensors are that tensor (spec §6.3)."""
    k, inner = next((k, v) for k, v in enumerate(index["inputs"]) if v.get("kind") == "tensor")
    index["inputs"][k] = {"kind": "subclass", "cls": cls, "attrs": ["a", "b"], "items": [dict(inner, name=None)] * 2,
                          "context": None, "size": [str(n) for n in inner["shape"]],
                          "stride": [str(n) for n in inner["stride"]], "requires_grad": False, "name": inner["name"]}


def index_cases(valid: bytes, p: Parsed, escape_root: Path) -> list[Case]:
    """Semantic defects past every checksum: names, counts, sizes, records, graph targets."""
    cases: list[Case] = []
    blob = _blob_names(p)[0]

    def add(name, category, data, reject=ALL, errors=("ArchiveError",), **kw):
        cases.append(Case(name, category, data, reject, errors, **kw))

    # member names in the index (and in their tar headers, consistently)
    def rename(old, new):
        return lambda members: [(new if n == old else n, d) for n, d in members]

    for label, bad in [("dotdot", "../escaped"), ("dotdot_inner", "blobs/../../escaped"),
                       ("absolute", str(escape_root / "abs")), ("dot", "./graph.py"), ("uppercase", "Graph.py"),
                       ("backslash", "..\\escaped"), ("nul", "graph.py\0x"), ("empty", ""),
                       ("long", "a" * 200), ("trailing_slash", "graph/")]:
        try:
            add(f"name_{label}", "names", rebuild(p, None, rename("graph.py", bad)), ALL, ("UnsafeArchiveError",))
        except (ValueError, UnicodeError):  # a name tarfile itself cannot encode
            pass
    add("name_duplicate", "names", rebuild(p, None, lambda m: m + [("graph.py", b"second copy\n")]), ALL,
        ("UnsafeArchiveError",))
    add("name_index_member", "names", rebuild(p, None, lambda m: m + [(INDEX_MEMBER, b"{}")]), ALL)
    add("name_layout_not_first", "names", rebuild(p, None, lambda m: m[1:] + m[:1]), ALL)
    add("name_bad_blob", "names", rebuild(p, None, lambda m: m + [("blobs/sha256/xyz", b"x")]), ALL,
        ("IndexSchemaError",))

    # container section lies
    def members_edit(fn):
        def edit(index):
            fn(index["container"]["members"])
        return edit

    def lie_size(ms):
        ms[-1]["size"] += 1
    add("members_size_lie", "counts", rebuild(p, members_edit(lie_size), set_members=False), ALL)

    def lie_huge(ms):
        ms[-1]["size"] = 1 << 62
    add("members_size_huge", "counts", rebuild(p, members_edit(lie_huge), set_members=False), ALL)

    def lie_frames(ms):
        ms[-1]["frames"] = 1 << 40
    add("members_frames_huge", "counts", rebuild(p, members_edit(lie_frames), set_members=False), ALL)
    add("members_not_list", "counts", rebuild(p, lambda i: i["container"].update(members={"a": 1}), set_members=False),
        ALL)
    add("members_empty", "counts", rebuild(p, lambda i: i["container"].update(members=[]), set_members=False), ALL)
    add("frame_size_zero", "counts", rebuild(p, lambda i: i["container"].update(frame_size=0), set_members=False), ALL)
    add("frame_size_huge", "counts", rebuild(p, lambda i: i["container"].update(frame_size=1 << 40), set_members=False),
        ALL)
    many = [(f"extra/m{i:05d}", b"") for i in range(300)]
    add("members_over_limit", "counts", rebuild(p, None, lambda m: m + many), ALL, ("LimitExceededError",),
        limits={"max_members": 64}, note="300 members against a member limit of 64")
    add("frames_over_limit", "counts", valid, ALL, ("LimitExceededError",), limits={"max_frames": 4})
    add("index_over_limit", "counts", valid, ALL, ("LimitExceededError",), limits={"max_index_bytes": 64})
    add("total_bytes_over_limit", "counts", valid, ALL, ("LimitExceededError",), limits={"max_total_bytes": 16})

    # storages and inputs
    def storage_edit(**fields):
        def edit(index):
            index["storages"][0].update(fields)
        return edit

    def input_edit(**fields):
        def edit(index):
            _first_tensor_input(index).update(fields)
        return edit

    add("storage_size_mismatch", "records", rebuild(p, storage_edit(size=64)), ALL)
    add("storage_digest_missing_blob", "records", rebuild(p, storage_edit(digest="sha256:" + "ab" * 32)), ALL)
    add("storage_digest_malformed", "records", rebuild(p, storage_edit(digest="md5:1234")), ALL)
    add("storage_fidelity_unknown", "records", rebuild(p, storage_edit(fidelity="fake")), ALL)
    add("storage_negative_size", "records", rebuild(p, storage_edit(size=-1)), ALL)
    add("storage_absent_huge", "records", rebuild(p, storage_edit(size=1 << 60, digest=None, fidelity="absent")), ALL,
        heavy=True, note="an absent storage declaring 2**60 bytes: load must refuse before allocating")
    add("storage_zero_fill_huge", "records", rebuild(p, storage_edit(size=1 << 50, digest=None, fill=0)), ALL,
        heavy=True)
    add("storage_zero_fill_2tib", "records", rebuild(p, storage_edit(size=1 << 41, digest=None, fill=0)),
        frozenset({"load"}), heavy=True,
        note="2 TiB of zeros: within the total-bytes cap, but no machine here can allocate it")
    add("storage_device_bogus", "records", rebuild(p, storage_edit(device="nonsense:99")), frozenset({"load"}))
    add("storage_device_not_str", "records", rebuild(p, storage_edit(device=7)), ALL)
    add("storage_not_map", "records", rebuild(p, lambda i: i["storages"].__setitem__(0, [1, 2])), ALL)
    add("storages_missing", "records", rebuild(p, lambda i: i.pop("storages")), ALL)
    add("input_storage_oob", "records", rebuild(p, input_edit(storage=99)), ALL)
    add("input_storage_negative", "records", rebuild(p, input_edit(storage=-1)), ALL)
    add("input_dtype_unknown", "records", rebuild(p, input_edit(dtype="float128")), ALL)
    add("input_dtype_quantized", "records", rebuild(p, input_edit(dtype="qint8")), ALL)
    add("input_view_past_storage", "records", rebuild(p, input_edit(shape=[100, 100])), ALL)
    add("input_shape_overflow", "records", rebuild(p, input_edit(shape=[1 << 61, 1 << 61, 1 << 61], stride=[0, 0, 0])),
        ALL,
        note="a broadcast view whose element count overflows int64")
    add("input_shape_rank_mismatch", "records", rebuild(p, input_edit(shape=[2, 4], stride=[1])), ALL)
    add("input_rank_huge", "records", rebuild(p, input_edit(shape=[1] * 100, stride=[1] * 100)), ALL)
    add("input_shape_not_int", "records", rebuild(p, input_edit(shape=["2", 4])), ALL)
    add("input_shape_bool", "records", rebuild(p, input_edit(shape=[True, 4])), ALL)
    add("input_offset_huge", "records", rebuild(p, input_edit(offset=1 << 62)), ALL)
    add("input_stride_negative", "records", rebuild(p, input_edit(stride=[-4, 1])), ALL)
    add("input_requires_grad_int", "records", rebuild(p, input_edit(dtype="int32", requires_grad=True)), ALL)
    add("input_kind_unknown", "records",
        rebuild(p, lambda i: i["inputs"].__setitem__(0, {"kind": "pickle", "value": "x"})), ALL)
    add("input_int_is_str", "records", rebuild(p, lambda i: i["inputs"][1].update(value="3")), ALL)
    add("inputs_count_mismatch", "records", rebuild(p, lambda i: i["inputs"].append({"kind": "none"})), ALL)

    def deep_value(index):
        v: dict = {"kind": "int", "value": 1}
        for _ in range(40):
            v = {"kind": "tuple", "items": [v]}
        index["inputs"][1] = v
    add("input_nesting_deep", "records", rebuild(p, deep_value), ALL)
    add("section_not_map", "records", rebuild(p, lambda i: i.update(config=[1, 2, 3])), ALL)
    add("digest_algorithm_unknown", "records", rebuild(p, lambda i: i.update(digest_algorithm="md5")), ALL)

    # blob contents
    orig = dict(p.members)[blob]
    changed = bytes([orig[0] ^ 1]) + orig[1:]
    add("blob_digest_mismatch", "digest", rebuild(p, None, lambda m: _replace_member(m, blob, changed)), FULL,
        ("DigestMismatchError",), note="blob bytes do not hash to the blob's name (all frames intact)")
    empty_named = "blobs/sha256/" + "00" * 32
    add("blob_empty_misnamed", "digest", rebuild(p, None, lambda m: m + [(empty_named, b"")]), FULL,
        ("DigestMismatchError",))

    # the graph
    def graph_edit(fn):
        def edit(index):
            fn(index["graph"])
        return edit

    def set_call(target, args=None, op="call_function"):
        def fn(g):
            n = next(n for n in g["nodes"] if n["op"] == "call_function")
            n["op"], n["target"] = op, target
            if args is not None:
                n["args"] = args
        return fn

    node_x = {"k": "node", "v": "x"}
    for label, target, args in [
        ("os_system", "os.system", ["touch /tmp/reproarchive-hostile-pwned"]),
        ("builtins_eval", "builtins.eval", ["__import__('os')"]),
        ("builtins_exec", "builtins.exec", ["print(1)"]),
        ("builtins_open", "builtins.open", ["/etc/passwd"]),
        ("dunder_import", "builtins.__import__", ["os"]),
        ("torch_load", "torch.load", ["/etc/passwd"]),
        ("torch_from_file", "torch.from_file", ["/etc/passwd"]),
        ("torch_save", "torch.save", [node_x, "/tmp/x"]),
        ("torch_hub", "torch.hub.load", ["a", "b"]),
        ("torch_library", "torch.library.define", ["x"]),
        ("getattr_dunder", "builtins.getattr", [node_x, "__class__"]),
        ("getattr_private", "builtins.getattr", [node_x, "_cdata"]),
        ("getattr_dynamic", "builtins.getattr", [node_x, node_x]),
        ("debugprims", "torch.ops.debugprims.load_tensor.default", ["x", [1], [1]]),
        ("alias_refs_torch_load", "torch._refs.torch.load", ["/etc/passwd"]),
        ("alias_functional_torch_load", "torch.nn.functional.torch.load", ["/etc/passwd"]),
        ("dunder_segment", "torch.Tensor.__reduce_ex__", [node_x, 2]),
        ("operator_attrgetter", "operator.attrgetter", ["__class__"]),
        ("importlib", "importlib.import_module", ["os"]),
        ("malformed", "torch.add(1)", [1]),
    ]:
        add(f"target_{label}", "targets", rebuild(p, graph_edit(set_call(target, args))), ALL, ("UnsafeArchiveError",))
    # a record of the wrong type is a schema error, before any allowlist is asked
    add("target_not_a_string", "targets", rebuild(p, graph_edit(set_call(12345, [1]))), ALL, ("IndexSchemaError",))
    # Names under an allowed prefix that reach something else only once torch has imported that
    # module: verify/inspect check what a name resolves to where it resolves; load always does.
    for label, target in [("alias_symbolic_shapes_os", "torch.fx.experimental.symbolic_shapes.os.system"),
                          ("config_load_config", "torch._functorch.config.load_config")]:
        add(f"target_{label}", "targets", rebuild(p, graph_edit(set_call(target, ["true"]))), frozenset({"load"}),
            ("UnsafeArchiveError",))
    add("method_system", "targets", rebuild(p, graph_edit(set_call("system", [node_x, "true"], op="call_method"))), ALL,
        ("UnsafeArchiveError",))
    add("method_reduce_ex", "targets", rebuild(p, graph_edit(set_call("__reduce_ex__", [node_x, 2], op="call_method"))),
        ALL, ("UnsafeArchiveError",))
    add("method_private", "targets", rebuild(p, graph_edit(set_call("_make_subclass", [node_x], op="call_method"))),
        ALL, ("UnsafeArchiveError",))

    # (1.3) an operator passed as a value (the ``operator`` argument tag) is judged as a call
    # target: a name outside torch, or an operator whose effect is refused, is refused
    def pass_operator(hop, name):
        return set_call(f"torch.ops.higher_order.{hop}", [node_x, {"k": "operator", "v": name}, node_x])

    for label, hop, name in OPERATOR_ARGUMENTS:
        add(f"operator_arg_{label}", "targets", rebuild(p, graph_edit(pass_operator(hop, name))), ALL,
            ("UnsafeArchiveError",))
    add("operator_arg_to_add", "targets", rebuild(p, graph_edit(set_call(
        "torch.add", [node_x, {"k": "operator", "v": "torch.ops.aten.relu.default"}]))), ALL, ("UnsafeArchiveError",),
        note="an operator may only be passed to a higher-order operator that calls it")

    # (1.3) a tensor subclass is rebuilt only when torch defines it (a fixed table): any other
    # class name is recorded, never imported, and not replayable here
    for label, cls in SUBCLASS_CLASSES:
        add(f"subclass_class_{label}", "targets", rebuild(p, lambda index, cls=cls: as_subclass(index, cls)),
            frozenset({"load"}), ("NotReplayableHereError",))

    def module_class(cls):
        def fn(g):
            next(e for e in g["module_state"] if e["kind"] == "module")["class"] = cls
        return fn

    for label, cls in [("os_system", "os.system"), ("builtins_object", "builtins.object"),
                       ("graphmodule", "torch.fx.graph_module.GraphModule"),
                       ("alias_hop", "torch.nn.modules.module.torch.fx.GraphModule"),
                       ("optimized_module", "torch._dynamo.eval_frame.OptimizedModule"),
                       ("not_module", "torch.nn.functional.relu"), ("dunder", "torch.nn.Module.__subclasses__")]:
        add(f"module_class_{label}", "targets", rebuild(p, graph_edit(module_class(cls))), ALL, ("UnsafeArchiveError",))

    def module_attr(key, value):
        def fn(g):
            next(e for e in g["module_state"] if e["kind"] == "module")["attributes"][key] = value
        return fn
    add("module_attr_dunder", "graph", rebuild(p, graph_edit(module_attr("__class__", "x"))), frozenset({"load"}))
    add("module_attr_internal", "graph", rebuild(p, graph_edit(module_attr("_parameters", 1))), frozenset({"load"}))

    def state_path(path):
        def fn(g):
            g["module_state"][0]["path"] = path
        return fn
    add("state_path_dunder", "graph", rebuild(p, graph_edit(state_path("__class__"))), ALL, ("UnsafeArchiveError",))
    add("state_path_traversal", "graph", rebuild(p, graph_edit(state_path("lin/../x"))), ALL, ("UnsafeArchiveError",))

    # graph structure
    def nodes_edit(fn):
        return graph_edit(lambda g: fn(g["nodes"]))

    add("graph_undefined_node", "graph",
        rebuild(p, nodes_edit(lambda ns: ns[-1].update(args=[{"k": "node", "v": "nope"}]))),
        frozenset({"load"}))
    add("graph_forward_reference", "graph", rebuild(p, nodes_edit(lambda ns: ns.insert(2, ns.pop(-2)))),
        frozenset({"load"}))
    add("graph_duplicate_name", "graph", rebuild(p, nodes_edit(lambda ns: ns[3].update(name="x"))), frozenset({"load"}))
    add("graph_two_outputs", "graph", rebuild(p, nodes_edit(lambda ns: ns.append(dict(ns[-1], name="output2")))),
        frozenset({"load"}))
    add("graph_no_output", "graph", rebuild(p, nodes_edit(lambda ns: ns.pop())), frozenset({"load"}))
    add("graph_bad_op", "graph", rebuild(p, nodes_edit(lambda ns: ns[3].update(op="call_pickle"))), frozenset({"load"}))
    add("graph_nodes_not_list", "graph", rebuild(p, graph_edit(lambda g: g.update(nodes={"a": 1}))), ALL)
    add("graph_missing", "graph", rebuild(p, lambda i: i.pop("graph")), ALL)
    add("graph_arg_unknown_tag", "graph",
        rebuild(p, nodes_edit(lambda ns: ns[3]["args"].append({"k": "pickle", "v": "x"}))),
        frozenset({"load"}))
    add("graph_arg_bytes", "graph", rebuild(p, nodes_edit(lambda ns: ns[3]["args"].append(b"\x80\x04"))),
        frozenset({"load"}))
    add("graph_arg_unhashable_key", "graph",
        rebuild(p, nodes_edit(lambda ns: ns[3]["kwargs"].update(d={"k": "dict", "v": [[[1, 2], 3]]}))),
        frozenset({"load"}))
    add("graph_arg_bad_device", "graph",
        rebuild(p, nodes_edit(lambda ns: ns[3]["args"].append({"k": "device", "v": "warp:9"}))),
        frozenset({"load"}))
    add("graph_arg_dtype_unknown", "graph",
        rebuild(p, nodes_edit(lambda ns: ns[3]["args"].append({"k": "dtype", "v": "evil"}))),
        frozenset({"load"}))

    def deep_arg(ns):
        v: Any = 1
        for _ in range(60):
            v = [v]
        ns[3]["args"].append(v)
    add("graph_arg_deep", "graph", rebuild(p, nodes_edit(deep_arg)), frozenset({"load"}))

    def deep_graph(g):
        sub: dict = {"nodes": [{"op": "output", "name": "output", "target": "output", "args": [None], "kwargs": {}}],
                     "module_state": []}
        for _ in range(12):
            sub = {"nodes": list(sub["nodes"]), "module_state": [{"path": "sub", "kind": "graph", "graph": sub}]}
        g["module_state"].append({"path": "deep", "kind": "graph", "graph": sub})
    add("graph_subgraph_deep", "graph", rebuild(p, graph_edit(deep_graph)), frozenset({"load"}))

    # code injection through names FX pastes into the Python it generates and execs
    marker_ph = escape_root / "marker_placeholder"
    marker_kw = escape_root / "marker_kwarg"
    marker_nm = escape_root / "marker_name"
    inj_ph = f"n=__import__('os').system('touch {marker_ph}')"
    add("inject_placeholder_target", "codeexec", rebuild(p, nodes_edit(lambda ns: ns[1].update(target=inj_ph))), ALL,
        ("UnsafeArchiveError", "IndexSchemaError"), markers=(str(marker_ph),),
        note="FX writes placeholder targets into `def forward(...)` and execs it")
    inj_kw = f"alpha=__import__('os').system('touch {marker_kw}'),other"
    add("inject_kwarg_key", "codeexec", rebuild(p, nodes_edit(lambda ns: ns[3]["kwargs"].update({inj_kw: 1}))), ALL,
        ("UnsafeArchiveError", "IndexSchemaError"), markers=(str(marker_kw),))
    add("inject_node_name", "codeexec",
        rebuild(p, nodes_edit(lambda ns: ns[3].update(name=f"y;__import__('os').system('touch {marker_nm}')"))),
        frozenset({"load"}),
        markers=(str(marker_nm),))
    return cases


def code_cases(valid: bytes, p: Parsed, escape_root: Path) -> list[Case]:
    """A valid archive whose readable graph.py would write a marker file if anything ran it."""
    marker = escape_root / "marker_graph_py"
    code = (
        "import os, pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('graph.py was executed')\n"
        "os.system('true')\n"
        "class Repro:\n    pass\n"
    ).encode()
    data = rebuild(p, None, lambda m: _replace_member(m, "graph.py", code))
    extra = rebuild(p, None, lambda m: m + [("repro.py", code), ("notes/sitecustomize.py", code)])
    return [
        Case("code_graph_py_marker", "codeexec", data, NONE, markers=(str(marker),),
             note="valid archive: graph.py is for people; it must never run"),
        Case("code_extra_members_marker", "codeexec", extra, NONE, markers=(str(marker),),
             note="valid archive with extra Python members a newer minor might add"),
    ]


def bomb_cases(valid: bytes, p: Parsed) -> list[Case]:
    """Decompression bombs and msgpack bombs, each inside a self-consistent archive."""
    cases = []
    # a blob frame that inflates far beyond its declared size (seek table and index agree on
    # the declared size; the frame is 1 GiB of zeros in ~40 KB)
    declared = 256 << 10
    bomb_data = bytes(declared)
    name = "blobs/sha256/" + hashlib.sha256(bomb_data).hexdigest()

    def add_blob(members):
        return members + [(name, bomb_data)]

    def add_storage(index):
        index["storages"].append({"size": declared, "device": "cpu", "fidelity": "real",
                                  "digest": "sha256:" + name[-64:], "fill": None})
        index["inputs"].append({"kind": "tensor", "storage": len(index["storages"]) - 1, "dtype": "uint8",
                                "shape": [declared],
                                "stride": [1], "offset": 0, "requires_grad": False, "is_leaf": True, "dynamic": [],
                                "name": "bomb"})
        index["graph"]["nodes"].insert(2, {"op": "placeholder", "name": "bomb", "target": "bomb", "args": [],
                                           "kwargs": {}})

    probe = rebuild(p, add_storage, add_blob)
    pp = parse(probe)
    frame = pp.member_frames[name][0]
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=False)
    chunk = bytes(1 << 20)
    comp = cctx.compressobj()
    bomb = b"".join([comp.compress(chunk) for _ in range(1024)] + [comp.flush()])
    cases.append(Case("bomb_blob_frame_1gib", "bomb", rebuild(p, add_storage, add_blob, compressed={frame: bomb}),
                      frozenset({"verify", "unpack", "load"}), ("CorruptArchiveError",), heavy=True,
                      note=f"a {declared}-byte blob whose frame inflates to 1 GiB ({len(bomb)} compressed bytes)"))
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27, write_checksum=1, write_content_size=0)
    wide_obj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    wide = wide_obj.compress(bytes(declared)) + wide_obj.flush()
    cases.append(Case("bomb_window_128mib", "bomb", rebuild(p, add_storage, add_blob, compressed={frame: wide}),
                      frozenset({"verify", "unpack", "load"}), ("CorruptArchiveError",), heavy=True,
                      note="a frame that asks for a 128 MiB window, over the reader's 8 MiB cap"))
    # the index frame inflating beyond the footer's index size
    idx_frame = p.index_frame
    idx_bomb = cctx.compress(bytes(64 << 20))
    cases.append(Case("bomb_index_frame", "bomb", rebuild(p, compressed={idx_frame: idx_bomb}), ALL, heavy=True))

    # msgpack bombs: each a raw index in an otherwise consistent archive
    def raw_index(raw: bytes) -> bytes:
        return assemble(p.members, None, index_bytes=raw, frame_size=p.frame_size)

    hdr = {"format": "reproarchive", "version": schema.FORMAT_VERSION}
    base = msgpack.packb(hdr)
    bombs = {
        "array32_huge": b"\xdd\xff\xff\xff\xff" + b"\xc0" * 16,
        "map32_huge": b"\xdf\xff\xff\xff\xff" + b"\xc0" * 16,
        "nested_arrays": b"\xdd\x00\x10\x00\x00" * 20000,
        "nested_deep": b"\x91" * 100_000 + b"\xc0",
        "str32_huge": b"\x81\xa1k\xdb\xff\xff\xff\xff" + b"a" * 16,
        "bin32_huge": b"\x81\xa1k\xc6\xff\xff\xff\xff" + b"a" * 16,
        "ext_fixext": b"\x81\xa1k\xd4\x01\x00",
        "ext_timestamp": b"\x81\xa1k" + msgpack.packb(msgpack.Timestamp(0, 0)),
        "ext32": b"\x81\xa1k\xc9\x00\x00\x00\x04\x05abcd",
        "ext_in_index": b"\x83" + base[1:] + b"\xa1x\xd6\x02abcd",
        "not_a_map": msgpack.packb([1, 2, 3]),
        "non_str_key": b"\x81\x01\x02",
        "invalid_byte": b"\x81\xa1k\xc1",
        "trailing": base + b"\xc0",
        "truncated": base[:-3],
        "invalid_utf8": b"\x81\xa1k\xa2\xff\xfe",
    }
    for label, raw in bombs.items():
        cases.append(Case(f"msgpack_{label}", "msgpack", raw_index(raw), ALL,
                          ("IndexSchemaError", "LimitExceededError"),
                          heavy=True))
    # many small containers: a few MB of msgpack that would decode to hundreds of MB
    amp = b"\xdd" + (2_000_000).to_bytes(4, "big") + b"\x90" * 2_000_000
    cases.append(Case("msgpack_amplification", "msgpack", raw_index(b"\x81\xa1k" + amp), ALL,
                      ("IndexSchemaError", "LimitExceededError"), heavy=True, limits={"max_index_memory": 32 << 20},
                      note="2M empty lists: 2 MB of msgpack, ~150 MB of Python objects; "
                           "the limit is lowered to 32 MiB"))
    return cases


def generate(workdir: str | os.PathLike, *, escape_root: str | os.PathLike | None = None,
             all_offsets: bool = True) -> list[Case]:
    """Build the valid archive in ``workdir`` and every hostile case from it.

    ``escape_root`` is a folder *outside* any extraction target: absolute member names, symlink
    targets and code-execution markers point into it, so a test can assert it stays empty.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    escape_root = Path(escape_root) if escape_root is not None else workdir / "escape"
    escape_root.mkdir(parents=True, exist_ok=True)
    valid_path = make_valid(workdir / "valid.tar.zst")
    valid = valid_path.read_bytes()
    p = parse(valid)
    cases = [Case("control_valid", "control", valid, NONE, note="the archive every case is derived from")]
    cases += container_cases(valid, p)
    cases += byte_cases(valid, p, all_offsets=all_offsets)
    cases += tar_cases(valid, p, workdir, escape_root)
    cases += index_cases(valid, p, escape_root)
    cases += code_cases(valid, p, escape_root)
    cases += bomb_cases(valid, p)
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


# --------------------------------------------------------------------------------------------
# running one library operation on one file (shared by the tests and the bomb child process)


def run_library_op(op: str, path: str | os.PathLike, sandbox: str | os.PathLike, limits: dict | None = None) -> dict:
    """Run ``op`` on ``path``; returns {"outcome": "ok"|"archive_error"|"leak", "type", "message", ...}.

    ``sandbox`` is the only folder the operation may write into (unpack writes ``sandbox/out``).
    """
    import warnings

    import reproarchive
    from reproarchive.errors import ArchiveError
    from reproarchive.format.layout import Limits

    kw = {"limits": Limits(**limits)} if limits else {}
    out: dict[str, Any] = {"op": op}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if op == "verify":
                out["digest"] = reproarchive.verify(path, progress=False, **kw).digest
            elif op == "load":
                repro = reproarchive.load(path, **kw)
                out["digest"] = repro.digest
                out["args"] = [_fingerprint(a) for a in repro.args]
                out["code"] = repro.gm.code
            elif op == "inspect":
                out["digest"] = reproarchive.inspect(path, **kw).digest
            elif op == "unpack":
                dest = Path(sandbox) / "out"
                reproarchive.unpack(path, dest, progress=False, **kw)
                out["files"] = {str(f.relative_to(dest)): hashlib.sha256(f.read_bytes()).hexdigest()
                                for f in sorted(dest.rglob("*")) if f.is_file()}
            else:
                raise ValueError(op)
        out["outcome"] = "ok"
    except ArchiveError as exc:
        out.update(outcome="archive_error", type=type(exc).__name__, message=str(exc),
                   mro=[c.__name__ for c in type(exc).__mro__])
    except Exception as exc:  # noqa: BLE001 - anything else is a defect the tests report
        out.update(outcome="leak", type=type(exc).__name__, message=str(exc)[:500])
    return out


def _fingerprint(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        return [str(t.dtype), list(t.shape), list(t.stride()), t.storage_offset(),
                hashlib.sha256(bytes(t.contiguous().view(torch.uint8).reshape(-1).clone().untyped_storage())).hexdigest()
                if t.numel() else ""]
    if isinstance(value, (list, tuple)):
        return [_fingerprint(v) for v in value]
    return repr(value)


def _child(argv: list[str]) -> int:
    """``--child JOBS.json BUDGET``: run library ops with BUDGET bytes of address space beyond what
    this process maps once torch and the library's readers are imported, one JSON line per job on
    stdout (used for the bombs)."""
    import resource

    import torch  # noqa: F401 - mapped before the limit is taken

    import reproarchive.archive.checking  # noqa: F401
    import reproarchive.archive.loading  # noqa: F401

    mapped = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                  if line.startswith("VmSize:"))
    limit = mapped + int(argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    jobs = json.loads(Path(argv[0]).read_text())
    for job in jobs:
        res = run_library_op(job["op"], job["path"], job["sandbox"], job.get("limits"))
        res["name"] = job["name"]
        res.pop("args", None)
        res.pop("code", None)
        print(json.dumps(res), flush=True)
    return 0


def write_corpus(outdir: str | os.PathLike, cases: list[Case]) -> Path:
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for case in cases:
        (outdir / f"{case.name}.tar.zst").write_bytes(case.data)
    (outdir / "MANIFEST.json").write_text(json.dumps([c.manifest() for c in cases], indent=1) + "\n")
    return outdir


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return _child(argv[1:])
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python tests/hostile_corpus.py OUTDIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    cases = generate(out / "_work", escape_root=out / "_escape")
    write_corpus(out, cases)
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.category] = counts.get(c.category, 0) + 1
    for cat, n in sorted(counts.items()):
        print(f"{n:6d}  {cat}")
    print(f"{len(cases):6d}  cases written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

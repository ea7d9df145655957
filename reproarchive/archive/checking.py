"""``verify`` and ``unpack``: every frame decompressed once and checked, blobs rehashed.

Opening the archive already checked its footer, seek table and every record (the schema);
what is left here is what only the bytes can tell: each frame against what the index implies,
each blob against its name, and each call target against this torch's allowlist.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

from reproarchive.archive.inspection import NamedByIndex, randomness_label
from reproarchive.errors import CorruptArchiveError, DigestMismatchError, Rule
from reproarchive.format import digests, layout
from reproarchive.format.atomic import atomic_dir
from reproarchive.format.layout import LAYOUT_MEMBER, Limits
from reproarchive.format.reader import ContainerReader
from reproarchive.progress import ProgressFn, Tracker


def _check_stream(reader: ContainerReader, sink: Callable[[str, memoryview], None] | None, progress,
                  desc: str = "verify") -> dict:
    """Decompress every frame once and check it: structure byte-exact, blobs by digest."""
    hashers: dict[str, Any] = {}
    last_frame = {m.name: m.first_frame + m.frames - 1 for m in reader.members.values()}
    expected_layout = layout.layout_member_bytes(*reader.version)
    blobs = 0
    total = sum(d for _, d in reader.frames)
    pbar = Tracker(progress, desc, total)
    for (i, data), (j, expected) in zip(reader.iter_frames(pbar.update), reader.expected_frame_bytes()):
        assert i == j
        if isinstance(expected, bytes):
            if data != expected:
                raise CorruptArchiveError(f"frame {i} (tar header or padding) is not what the index implies",
                                          "the archive is damaged or was modified", rule=Rule.HEADER_BYTES)
            continue
        name = expected
        if sink is not None:
            sink(name, data)
        if name == LAYOUT_MEMBER and bytes(data) != expected_layout:
            raise CorruptArchiveError("the layout member does not match the footer's format version",
                                      rule=Rule.LAYOUT_MEMBER)
        if layout.is_blob_name(name):
            h = hashers.get(name)
            if h is None:
                h = hashers[name] = digests.new_hasher(name.split("/")[1])
            h.update(data)
            if i == last_frame[name]:
                actual = h.hexdigest()
                if actual != name.rsplit("/", 1)[1]:
                    raise DigestMismatchError(
                        f"blob {name} hashes to {actual[:16]}..., not its name",
                        "the archive is damaged; copy it again", rule=Rule.BLOB_DIGEST,
                    )
                blobs += 1
    # empty blobs have no data frames
    for name, m in reader.members.items():
        if layout.is_blob_name(name) and m.frames == 0:
            algo, hexd = name.split("/")[1:]
            if digests.of_bytes(b"", algo) != f"{algo}:{hexd}":
                raise DigestMismatchError(f"empty blob {name} is not named by the digest of no bytes",
                                          rule=Rule.BLOB_DIGEST)
            blobs += 1
    return {"blobs": blobs, "bytes": total}


@dataclasses.dataclass(frozen=True)
class VerifyReport(NamedByIndex):
    """An archive that passed every check; ``to_plain()`` is ``verify --json``."""

    valid: bool  # always True: a failed check raises instead
    path: str
    format: str
    digest: str  # the index digest
    members: int
    blobs: int
    uncompressed_bytes: int
    file_bytes: int
    # intact and safe, but what this process lacks to replay it (``run`` answers 125 for it)
    not_replayable_here: tuple[str, ...] = ()
    randomness: str = ""  # ``inspection.randomness_label``: random ops, and whether the RNG state is recorded


def verify(path: str | os.PathLike, *, progress: ProgressFn | None = None,
           limits: Limits = layout.DEFAULT_LIMITS) -> VerifyReport:
    """Check every rule of the spec and rehash every blob; raises an ArchiveError subclass."""
    return _verify(path, progress, limits, readable_here=True)


def verify_bytes(path: str | os.PathLike, *, progress: ProgressFn | None = None,
                 limits: Limits = layout.DEFAULT_LIMITS) -> VerifyReport:
    """``verify`` without the questions only this torch can answer (dtypes, device types, call
    targets): every byte rule and every blob digest. What moving an archive checks (``pull``),
    so that a transport never needs torch, nor refuses an archive a newer torch could read."""
    return _verify(path, progress, limits, readable_here=False)


def _verify(path, progress, limits: Limits, *, readable_here: bool) -> VerifyReport:
    missing = None
    with ContainerReader(path, limits=limits) as reader:
        if readable_here:
            from reproarchive.codec.checks import check_readable_here  # torch: only for this question

            missing = check_readable_here(reader.index, replaying=False)
        stats = _check_stream(reader, None, progress)
        return VerifyReport(
            valid=True,
            path=str(path),
            format=f"{reader.version[0]}.{reader.version[1]}",
            digest=reader.index_digest,
            members=len(reader.members) + 1,
            blobs=stats["blobs"],
            uncompressed_bytes=stats["bytes"],
            file_bytes=reader.file_size,
            # intact and safe, but this process lacks what replaying it needs (``run`` says 125)
            not_replayable_here=tuple(missing or ()),
            randomness=randomness_label(reader.index.records),
        )


def default_unpack_dir(path: str | os.PathLike) -> Path:
    name = Path(path).name
    for suffix in (".tar.zst", ".tzst", ".zst", ".tar"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return Path(name[: -len(suffix)])
    return Path(name + ".d")


def unpack(path: str | os.PathLike, dest: str | os.PathLike | None = None, *, progress: ProgressFn | None = None,
           limits: Limits = layout.DEFAULT_LIMITS) -> Path:
    """Extract to ``dest`` what ``tar -x`` would, after checking everything, writing only paths
    built from validated member names; on any failure nothing is left behind."""
    dest = Path(dest) if dest is not None else default_unpack_dir(path)
    from reproarchive.codec.checks import check_readable_here  # torch: only for this question

    with ContainerReader(path, limits=limits) as reader:
        check_readable_here(reader.index, replaying=False)  # unpacking replays nothing
        with atomic_dir(dest) as tmp:
            # Frames come in member order, so one file is open at a time however many members
            # the archive has (a valid archive may hold more than the open-file limit).
            current: list[Any] = [None, None]  # name, file
            written: set[str] = set()

            def open_member(name: str):
                target = tmp.joinpath(*name.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                written.add(name)
                return open(target, "xb")

            def sink(name: str, data: memoryview) -> None:
                if current[0] != name:
                    if current[1] is not None:
                        current[1].close()
                    current[:] = [name, open_member(name)]
                current[1].write(data)

            try:
                _check_stream(reader, sink, progress, desc="unpack")
            finally:
                if current[1] is not None:
                    current[1].close()
            for m in reader.members.values():
                if m.size == 0 and m.name not in written:
                    open_member(m.name).close()
    return dest

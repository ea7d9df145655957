"""What an archive must not carry: the absolute paths and the user name of the machine that
made it, anywhere in its decompressed index (issue: one redaction for every capture path).

The side door of ``SourceTests.test_redaction_is_applied``: the index is read as ``tar`` and
msgpack read it, not through reproarchive's reader, and every string in it is searched."""

from __future__ import annotations

import getpass
import io
import os
import sys
import tarfile
import tempfile
from pathlib import Path

import msgpack
import zstandard

__all__ = ["index_strings", "machine_paths_in"]


def index_strings(archive: str | os.PathLike) -> list[tuple[str, str]]:
    """(where, string) for every string in the archive's index, read as ``tar`` would."""
    with open(archive, "rb") as f:
        data = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        index = msgpack.unpackb(tar.extractfile("index.msgpack").read(), raw=False, strict_map_key=False)
    out: list[tuple[str, str]] = []

    def walk(value, where):
        if isinstance(value, str):
            out.append((where, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k, f"{where}.<key>")
                walk(v, f"{where}.{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")

    walk(index, "index")
    return out


def machine_paths_in(archive: str | os.PathLike, *folders: str | os.PathLike) -> list[str]:
    """Every string of the index that names this machine: home, the temporary folder, Python
    and its packages, the folder reproarchive is imported from (a checkout, or site-packages),
    inductor's cache, ``folders`` (the test's cwd, a dump folder), or the user name inside a
    path. Empty when the archive is clean."""
    import torch

    needles = {os.path.expanduser("~") + "/", tempfile.gettempdir() + "/", sys.prefix + "/",
               str(Path(torch.__file__).resolve().parents[1]) + "/",
               str(Path(__file__).resolve().parents[2]) + "/",
               f"torchinductor_{getpass.getuser()}"}
    needles |= {str(Path(f).resolve()) for f in folders} | {str(f) for f in folders}
    needles = {n for n in needles if len(n) > 2}
    return [f"{where}: {value[:160]!r} (names {needle!r})"
            for where, value in index_strings(archive) for needle in needles if needle in value]

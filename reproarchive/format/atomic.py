"""Write files and folders so that readers only ever see nothing or the finished result.

Everything reproarchive writes goes to a temporary name in the destination's own folder
(same filesystem, so the final ``os.replace`` is atomic) and is renamed into place only when
complete; an exception, Ctrl-C or a kill leaves no half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from reproarchive.errors import SourceError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield the path of an empty temporary file that becomes ``path`` on success.

    For writers that need the file by name while building it (``pull`` verifies the rebuilt
    archive before it may appear under its final name); the caller makes it durable.
    """
    final = Path(path)
    if final.is_dir():
        raise SourceError(f"{final} is a directory", "give a file name for the archive")
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, *, fsync: bool = True) -> Iterator[BinaryIO]:
    with atomic_path(path) as tmp:
        with open(tmp, "wb", buffering=1 << 20) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary folder that becomes ``path`` on success.

    ``path`` must not exist or be an empty folder: we never merge into or overwrite a
    user's folder.
    """
    final = Path(path)
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise SourceError(f"{final} already exists and is not an empty folder",
                          "choose another output folder or remove it")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if final.exists():
            final.rmdir()
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_if_changed(target: Path, text: str) -> list[Path]:
    """Write a generated file only when its text changed (``[target]``, else ``[]``), so that
    regenerating the spec files touches only what differs."""
    if target.exists() and target.read_text(encoding="utf-8") == text:
        return []
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return [target]

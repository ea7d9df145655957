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


def remove_dir(path: str | os.PathLike) -> None:
    """Remove a folder so that readers see it whole or gone: it is first renamed to a hidden
    name beside it (atomic), then emptied. A kill between the two leaves a hidden
    ``.NAME.*.removing`` folder, never a folder under its own name with some of its files."""
    final = Path(path)
    doomed = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".removing", dir=final.parent))
    try:
        os.replace(final, doomed)  # onto the empty folder just made: atomic on POSIX
    except FileNotFoundError:
        doomed.rmdir()
        return
    shutil.rmtree(doomed, ignore_errors=True)


def remove_leftovers(final: str | os.PathLike) -> list[Path]:
    """Remove what killed writers of ``final`` left beside it (``atomic_path``'s ``.partial``
    files, ``remove_dir``'s ``.removing`` folders); the removed paths. Only for a caller that
    knows no other writer of ``final`` runs now (it holds their lock)."""
    final = Path(final)
    gone = []
    for left in final.parent.glob(f".{final.name}.*"):
        if left.name.endswith(".partial") and left.is_file():
            left.unlink(missing_ok=True)
        elif left.name.endswith(".removing") and left.is_dir():
            shutil.rmtree(left, ignore_errors=True)
        else:
            continue
        gone.append(left)
    return gone


def finish_removals(parent: str | os.PathLike, names: str) -> list[Path]:
    """Finish the removals a kill cut short: ``remove_dir``'s hidden ``.NAME.*.removing``
    folders in ``parent`` whose NAME matches the glob ``names``; the removed paths. Safe at any
    time, without a lock: such a folder is already gone by its name, and a removal still running
    on it only races this one to delete the same files."""
    gone = []
    for left in Path(parent).glob(f".{names}.*.removing"):
        if left.is_dir() and not left.is_symlink():
            shutil.rmtree(left, ignore_errors=True)
            gone.append(left)
    return gone


def write_if_changed(target: Path, text: str) -> list[Path]:
    """Write a generated file only when its text changed (``[target]``, else ``[]``), so that
    regenerating the spec files touches only what differs."""
    if target.exists() and target.read_text(encoding="utf-8") == text:
        return []
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return [target]

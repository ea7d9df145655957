"""Real torch.compile failures captured into archives, with PyTorch's cheap bug injectors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import reproarchive


def capture_failure(path: Path, fn, args, backend: str, *, accuracy: bool = False) -> Path:
    """Compile ``fn`` with ``reproarchive.capture(backend)``, call it on ``args`` (it must fail)
    and return the archive the capture wrote at ``path``."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=reproarchive.capture(backend, path=path, accuracy=accuracy))
    # any failure: its type depends on the backend and the bug (compile, runtime or accuracy)
    with pytest.raises(Exception):  # noqa: B017
        compiled(*args)
    torch._dynamo.reset()
    assert Path(path).exists(), "capture did not write an archive"
    return Path(path)


def archives_after_death(folder: Path, timeout: float = 120) -> list[Path]:
    """The archives in ``folder`` once the guardian of a process that died there has completed
    its spool (it removes the spool when done), oldest name first."""
    import time

    deadline = time.monotonic() + timeout
    while list(folder.glob("spool-*")):
        assert time.monotonic() < deadline, f"the spool in {folder} was not completed within {timeout} s"
        time.sleep(0.05)
    return sorted(folder.glob("*.tar.zst"))


def kept(folder: Path) -> list[str]:
    """What capture keeps in ``folder`` while this process lives: its archives, and the spool
    entries a crash now would leave (the spool itself goes when the process ends normally)."""
    from reproarchive.archive.spool_folder import SpoolFolder

    if not folder.exists():
        return []
    names = sorted(p.name for p in folder.glob("*.tar.zst"))
    for spool in sorted(folder.glob("spool-*")):
        names += [f"{spool.name}/{name}" for name in SpoolFolder(spool).names()]
    return names


def stages_a_crash_would_leave(folder: Path) -> list[str]:
    """The failure stage of each archive a crash now would leave in ``folder``: those written,
    and each spool entry completed as the guardian would complete it (into a scratch folder)."""
    import tempfile

    from reproarchive.archive.spool_folder import SpoolFolder

    paths = sorted(folder.glob("*.tar.zst"))
    with tempfile.TemporaryDirectory() as scratch:
        for spool in sorted(folder.glob("spool-*")):
            opened = SpoolFolder(spool)
            paths += [opened.complete(name, Path(scratch) / f"{name}.tar.zst").path for name in opened.names()]
        return [reproarchive.load(p).records.failure.stage for p in paths]

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

"""What a minification wrote and said, shared by the minifier of one graph (``driver``) and of a
job (``job_minify``), which the driver hands a job to."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from reproarchive.errors import ReproArchiveError


@dataclasses.dataclass
class MinifyReport:
    """What ``minify_archive`` did; ``to_dict()`` is what ``run --minify --json`` prints."""

    archive: str
    output: str
    parent: str
    status: str  # "minified" | "not failing" | "unchanged"
    stats: dict[str, Any]
    code: str
    input_origins: list[str]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def output_path(path: str | os.PathLike, output: str | os.PathLike) -> Path:
    """``output`` as a Path, refused when it is the archive being minified."""
    output = Path(output)
    if Path(path).resolve() == output.resolve():
        raise ReproArchiveError("the output archive must differ from the input", "pass another -o path")
    return output

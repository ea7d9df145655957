"""reproarchive: one portable, verifiable, content-addressed file per torch.compile failure.

The public surface is the handful of verbs below; everything else is private. Names resolve
lazily so that ``reproarchive --help`` does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    # format and core library (spec/FORMAT.md)
    "pack": "reproarchive.archive",
    "load": "reproarchive.archive",
    "verify": "reproarchive.archive",
    "unpack": "reproarchive.archive",
    "inspect": "reproarchive.report",
    "Repro": "reproarchive.archive",
    "AbsentTensor": "reproarchive.tensor_codec",
    # capture after a failure
    "capture": "reproarchive.capture_backend",
    "pack_dump": "reproarchive.dump_import",
    # replay and export
    "run": "reproarchive.replay",
    "Outcome": "reproarchive.replay",
    "export": "reproarchive.script_export",
    # minify
    "minify": "reproarchive.minifier",
    # errors
    "ReproArchiveError": "reproarchive.errors",
    "ArchiveError": "reproarchive.errors",
    "NotAnArchiveError": "reproarchive.errors",
    "TruncatedArchiveError": "reproarchive.errors",
    "UnsupportedVersionError": "reproarchive.errors",
    "CorruptArchiveError": "reproarchive.errors",
    "DigestMismatchError": "reproarchive.errors",
    "LimitExceededError": "reproarchive.errors",
    "IndexSchemaError": "reproarchive.errors",
    "UnsafeArchiveError": "reproarchive.errors",
    "PackError": "reproarchive.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'reproarchive' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover
    from .archive import Repro, load, pack, unpack, verify  # noqa: F401
    from .report import inspect  # noqa: F401

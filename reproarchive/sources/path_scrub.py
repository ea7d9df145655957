"""Replacing the recording machine's paths (the dump folder, its store, inductor's cache) in what
an import records, so an archive does not carry where it was made."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from reproarchive.context.redaction import machine_prefixes, redact_paths
from reproarchive.format.plain import from_plain, to_plain


class Scrubber:
    """Replace the packing machine's paths in every string that goes into the archive.

    A thin layer over ``snapshot.redact_paths`` (component-boundary matching, symlink-resolved
    spellings, home as ``~``) with the prefixes only the dump import knows: the dump's folder and
    content store, the user's cwd, the child's scratch cwd, and the install locations that show
    up in tracebacks and compiler command lines (inductor's cache, site-packages, Python).
    """

    def __init__(self, prefixes: dict[str, str]):
        self.prefixes = {os.path.normpath(p): label for p, label in prefixes.items()
                         if p and os.path.normpath(p) != "/"}

    def text(self, s: str) -> str:
        return redact_paths(s, self.prefixes)

    def __call__(self, obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):  # a record: scrub its plain form
            return from_plain(type(obj), self(to_plain(obj)))
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self(k) if isinstance(k, str) else k: self(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(self(v) for v in obj)
        return obj


def scrub_prefixes(opts: argparse.Namespace, store: Path | None) -> dict[str, str]:
    prefixes = machine_prefixes()
    prefixes[os.getcwd()] = "<tmp>"
    for path in opts.cwd_prefix:
        prefixes[path] = "<cwd>"
    for path in opts.dump_prefix:
        prefixes[path] = "<dump>"
    if store is not None:
        prefixes[str(store)] = "<dump>/checkpoints"
    return prefixes

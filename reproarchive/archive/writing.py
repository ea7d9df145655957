"""The one archive writer of every capture source: a ``Capture`` in, one redacted archive out.

A capture source (``sources/``) finds a graph, its inputs and the records around them, and
says so with one value, ``Capture(graph, inputs, records)``; ``write_capture`` redacts the
records (``context.redaction``: no machine path, home folder or user name leaves the machine)
and packs them. No source assembles ``pack``'s arguments or calls the redaction itself, so a new
record field is filled where the source builds its ``Records`` and written here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reproarchive.archive.packing import pack
from reproarchive.context.redaction import redacted
from reproarchive.format.schema import Records


@dataclass(frozen=True)
class Capture:
    """What a capture source found: the graph (a ``torch.fx.GraphModule``), one input per
    placeholder, the records around them, not yet redacted, and the generator states the
    failing call started from (``codec.rng.rng_snapshot``; None: not seen)."""

    graph: Any
    inputs: Sequence[Any]
    records: Records
    rng_states: Mapping[str, Any] | None = None


def write_capture(capture: Capture, path: str | os.PathLike, *, prefixes: Mapping[str, str] | None = None,
                  **options: Any) -> Path:
    """Write ``capture`` to ``path``: its records redacted, then packed (``options`` are
    ``pack``'s: digest, level, frame_size, progress ...). ``prefixes`` are the source's own
    folders (``{folder: label}``), replaced besides this machine's; by default the working
    directory becomes ``.``."""
    table = {os.getcwd(): "."} if prefixes is None else dict(prefixes)
    return pack(capture.graph, list(capture.inputs), path, records=redacted(capture.records, table),
                rng_states=capture.rng_states, **options)

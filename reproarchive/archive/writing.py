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
from reproarchive.codec.custom_ops import LiveCustomOp
from reproarchive.compat.dispatch import disable_current_modes
from reproarchive.context.redaction import redacted, working_folder
from reproarchive.format.schema import JobRecord, Records


@dataclass(frozen=True)
class Capture:
    """What a capture source found: the graph (a ``torch.fx.GraphModule``), one input per
    placeholder, the records around them, not yet redacted, the calls of its custom ops where
    the source ran them on real data (``codec.recorded_calls.record_calls``), the generator states
    the failing call started from (``codec.rng.rng_snapshot``; None: not seen), and for a rank
    of a multi-rank job its job record (spec §8 ``job``)."""

    graph: Any
    inputs: Sequence[Any]
    records: Records
    job: JobRecord | None = None  # (1.3) one rank of a multi-rank job: its part (``archive.job_merge``)
    custom_ops: Sequence[LiveCustomOp] | None = None  # recorded calls; None: described at packing
    rng_states: Mapping[str, Any] | None = None


def write_capture(capture: Capture, path: str | os.PathLike, *, prefixes: Mapping[str, str] | None = None,
                  **options: Any) -> Path:
    """Write ``capture`` to ``path``: its records redacted, then packed (``options`` are
    ``pack``'s: digest, level, frame_size, progress ...). ``prefixes`` are the source's own
    folders (``{folder: label}``), replaced besides this machine's; by default the working
    directory becomes ``.``."""

    table = working_folder() if prefixes is None else dict(prefixes)
    # A compiler may be called with PyTorch's fake-tensor mode still active (AOTAutograd does so
    # for graphs with ``while_loop``): packing reads real tensors, so it runs outside any mode.
    with disable_current_modes():
        return pack(capture.graph, list(capture.inputs), path, records=redacted(capture.records, table),
                    job=capture.job, custom_ops=capture.custom_ops, rng_states=capture.rng_states,
                    prefixes=table, **options)

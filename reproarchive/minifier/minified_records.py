"""What a minified archive (or a candidate) records, made one way for a graph and for every rank
of a job: the minifier's driver and its job path both write through here, so the two cannot
keep different facts of their parent."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from reproarchive.codec.shapes import placeholder_names, restricted
from reproarchive.codec.tensors import FIDELITY_ABSENT
from reproarchive.format.schema import Records


def minified_records(records: Records, parent: str, parent_gm: Any, gm: Any, inputs: list, minify: Any,
                     inner: Mapping[str, tuple] | None = None) -> Records:
    """The records of a candidate or result cut from ``parent_gm`` (one graph's, or one rank's
    of a job): the parent's, this archive's provenance (``parent``, ``minify``) in place of the
    parent's, and the parent's shape policy for the inputs it kept, by placeholder name (a
    symbolic input stays symbolic), and for inputs cut from inner values whose sizes were the
    inputs' symbols (``inner``: ``codec.inner_shapes.inner_dims`` of the parent)."""
    shapes = restricted(records.shapes, placeholder_names(parent_gm), placeholder_names(gm), inputs, inner)
    return dataclasses.replace(records, parent=parent, minify=minify, shapes=shapes)


def not_original_positions(fidelity: list[str] | None, records: Records) -> set[int]:
    """Positions of the inputs of a graph (or one rank's) whose values are not the original data.

    An input counts as generated when it is absent, and also when the archive is itself a
    minified one that labelled it not real (zeros, a cast, a value computed from absent data):
    its bytes are stored as real, but they are not the original data, and a second minify must
    not launder them into it."""
    generated = {k for k, f in enumerate(fidelity or []) if f == FIDELITY_ABSENT}
    minify = records.minify
    if minify is not None and minify.inputs:
        generated |= {k for k, p in enumerate(minify.inputs) if not p.real}
    return generated


def labelled(entries: list[dict[str, Any]], generated: set[int]) -> list[dict[str, Any]]:
    """The minifier's per-input provenance (``depends_on``: positions of the graph's inputs)
    completed with ``from_absent`` (the value was computed from a ``generated`` input) and
    ``real`` (the values are, or are a block of, the original data)."""
    out = []
    for entry in entries:
        entry = dict(entry)
        absent = any(k in generated for k in entry.get("depends_on", []))
        entry["from_absent"] = absent
        entry["real"] = not absent and entry.get("values") in ("recorded", "cropped")
        out.append(entry)
    return out

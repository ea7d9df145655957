"""What a minified archive (or a candidate) records, made one way for a graph and for every rank
of a job: the minifier's driver and its job path both write through here, so the two cannot
keep different facts of their parent."""

from __future__ import annotations

import dataclasses
from typing import Any

from reproarchive.codec.shapes import placeholder_names, restricted
from reproarchive.format.schema import Records


def minified_records(records: Records, parent: str, parent_gm: Any, gm: Any, inputs: list, minify: Any) -> Records:
    """The records of a candidate or result cut from ``parent_gm`` (one graph's, or one rank's
    of a job): the parent's, this archive's provenance (``parent``, ``minify``) in place of the
    parent's, and the parent's shape policy for the inputs it kept, by placeholder name (a
    symbolic input stays symbolic)."""
    shapes = restricted(records.shapes, placeholder_names(parent_gm), placeholder_names(gm), inputs)
    return dataclasses.replace(records, parent=parent, minify=minify, shapes=shapes)

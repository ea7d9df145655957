"""Small valid records for tests that exercise the byte layer without torch graphs."""

from __future__ import annotations

from reproarchive.format.schema import ContainerRecord, GraphRecord, Index, NodeRecord, TupleArg


def minimal_index(frame_size: int = 4 << 20) -> Index:
    """An index with no inputs and a graph that returns nothing: enough for a container."""
    output = NodeRecord(op="output", name="output", target="output", args=(TupleArg(()),))
    return Index(container=ContainerRecord(frame_size=frame_size), digest_algorithm="sha256", storages=(),
                 inputs=(), graph=GraphRecord(nodes=(output,)))

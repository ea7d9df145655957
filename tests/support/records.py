"""Small valid records for tests that exercise the byte layer without torch graphs."""

from __future__ import annotations

from reproarchive.format.schema import ContainerRecord, GraphRecord, Index, NodeRecord, TupleArg


def minimal_index(frame_size: int = 4 << 20) -> Index:
    """An index with no inputs and a graph that returns nothing: enough for a container."""
    output = NodeRecord(op="output", name="output", target="output", args=(TupleArg(()),))
    return Index(container=ContainerRecord(frame_size=frame_size), digest_algorithm="sha256", storages=(),
                 inputs=(), graph=GraphRecord(nodes=(output,)))


def with_storage_devices(source, destination, device: str):
    """A copy of the archive at ``source`` whose storages are recorded on ``device``, written
    through the typed index and the container writer (what a capture on that device records;
    this machine needs no such device to make it). Returns ``destination``."""
    import dataclasses

    from reproarchive.format import layout, reader, writer

    with reader.ContainerReader(source) as r:
        index = r.index
        members = [(name, r.read_member(name)) for name in r.members if name != layout.LAYOUT_MEMBER]
    index = dataclasses.replace(index, storages=tuple(dataclasses.replace(s, device=device) for s in index.storages))
    with open(destination, "wb") as f:
        w = writer.ContainerWriter(f)
        for name, data in members:
            w.add_member(name, data)
        w.finish(index)
    return destination

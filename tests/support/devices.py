"""Archives recorded on devices this machine may not have (a CUDA capture, without a GPU)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

import reproarchive
from reproarchive.context import failure as failure_mod
from reproarchive.format import layout, reader, writer


def with_storage_devices(source: Path, destination: Path, device: str) -> Path:
    """A copy of the archive at ``source`` whose storages are recorded on ``device``, written
    through the typed index and the container writer (what a capture on that device records;
    this machine needs no such device to make it: generator states stay host bytes, spec §8
    ``rng``). Returns ``destination``."""
    with reader.ContainerReader(source) as r:
        index = r.index
        members = [(name, r.read_member(name)) for name in r.members if name != layout.LAYOUT_MEMBER]
    rng = index.records.rng
    states = {g.storage for g in rng.generators} if rng is not None else set()
    index = dataclasses.replace(index, storages=tuple(s if i in states else dataclasses.replace(s, device=device)
                                                      for i, s in enumerate(index.storages)))
    with open(destination, "wb") as f:
        w = writer.ContainerWriter(f)
        for name, data in members:
            w.add_member(name, data)
        w.finish(index)
    return destination


def pack_with_device_constant(path: Path, device: str, *, backend: str = "eager") -> Path:
    """``x + torch.ones(4, device=DEVICE)`` traced by Dynamo, its device constant edited to
    ``device`` (this machine need not have it), packed with CPU inputs and an unknown failure."""
    def f(x):
        return x + torch.ones(4, device="cpu")

    graphs = []
    torch._dynamo.reset()
    torch.compile(f, backend=lambda gm, ex: graphs.append(gm) or gm)(torch.randn(4))
    gm = graphs[0]
    for node in gm.graph.nodes:
        if "device" in node.kwargs:
            node.kwargs = {**node.kwargs, "device": torch.device(device)}
    gm.recompile()
    return Path(reproarchive.pack(gm, [torch.randn(4)], path, backend=backend,
                                  failure=failure_mod.unknown_record("test")))

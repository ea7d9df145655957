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
    def moved(index):
        sets = [index.records, *(index.job.records if index.job is not None else ())]  # a job's ranks' too
        states = {g.storage for records in sets if records.rng is not None for g in records.rng.generators}
        return dataclasses.replace(index, storages=tuple(s if i in states else dataclasses.replace(s, device=device)
                                                         for i, s in enumerate(index.storages)))

    return rewritten(source, destination, moved)


def rewritten(source: Path, destination: Path, change) -> Path:
    """A copy of the archive at ``source`` whose index is ``change(index)``, written through the
    typed index and the container writer, its members as they were. Returns ``destination``."""
    with reader.ContainerReader(source) as r:
        index = r.index
        members = [(name, r.read_member(name)) for name in r.members if name != layout.LAYOUT_MEMBER]
    index = change(index)
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


#: An H200 as ``torch.cuda.get_device_properties`` described it on torch 2.11 (the fields the
#: system record keeps before format 1.6).
H200 = {"index": 0, "name": "NVIDIA H200", "capability": "9.0", "total_memory": 150_109_880_320,
        "multi_processor_count": 132}


def recorded_on_gpu(source: Path, destination: Path, *, gpu: dict | None = None, changed: dict | None = None,
                    failure=None) -> Path:
    """A copy of the archive at ``source`` as a capture on ``cuda:0`` records it: its storages
    on the GPU, the system record's ``cuda`` section describing ``gpu`` (an H200 by default),
    Inductor's changed settings replaced by ``changed`` where given, and the failure replaced
    by ``failure`` where given. Returns ``destination``."""
    from reproarchive.format.schema import ConfigRecord, CudaInfo, GpuInfo

    def on_gpu(records):
        cuda = CudaInfo(available=True, version="13.0", device_count=1, devices=(GpuInfo(**(gpu or H200)),))
        changes = {"system": dataclasses.replace(records.system, cuda=cuda)}
        if changed is not None:
            changes["config"] = _inductor_changed(records.config or ConfigRecord(), changed)
        if failure is not None:
            changes["failure"] = failure
        return dataclasses.replace(records, **changes)

    moved = with_storage_devices(source, destination.with_suffix(".moved"), "cuda:0")
    try:
        return rewritten_records(moved, destination, on_gpu)
    finally:
        moved.unlink()


def rewritten_records(source: Path, destination: Path, change, *, requires_grad: bool | None = None) -> Path:
    """A copy of the archive at ``source`` whose records are ``change(records)`` (and whose
    floating tensor inputs require grad, or not, where ``requires_grad`` says). Returns
    ``destination``."""
    from reproarchive.format.schema import TensorValue

    def changed(index):
        changes = {"records": change(index.records)}
        if requires_grad is not None:
            changes["inputs"] = tuple(dataclasses.replace(v, requires_grad=requires_grad)
                                      if isinstance(v, TensorValue) and v.dtype.startswith("float") else v
                                      for v in index.inputs)
        return dataclasses.replace(index, **changes)

    return rewritten(source, destination, changed)


def _inductor_changed(config, changed: dict):
    """``config`` as a recording that changed exactly ``changed`` of Inductor's settings records
    it: the settings it changed before back at their recorded defaults, the new ones set, with
    this torch's values as their defaults."""
    name = "torch._inductor.config"
    modules = {m: dict(v) for m, v in config.modules.items()}
    values = modules.setdefault(name, {})
    old_changed, old_defaults = dict(config.changed.get(name, {})), dict(config.defaults.get(name, {}))
    for key in old_changed:
        if key in old_defaults:
            values[key] = old_defaults[key]
    defaults = {key: values.get(key) for key in changed}
    values.update(changed)
    return dataclasses.replace(config, modules=modules, changed={**config.changed, name: dict(changed)},
                               defaults={**config.defaults, name: defaults})


def job_recorded_on_gpu(source: Path, destination: Path, *, changed: dict[int, dict],
                        failures: dict | None = None, guards: dict | None = None) -> Path:
    """A copy of the job archive at ``source`` as a capture on ``cuda:0`` of every rank records
    it: its storages on the GPU, every rank's system record describing an H200, rank r's
    Inductor changed settings replaced by ``changed[r]``, rank r's failure (its outcome's, and
    the index's for the primary rank) by ``failures[r]`` and the shape guards its compile ended
    with by ``guards[r]`` (a compile for the GPU adds its own), where given. Returns
    ``destination``."""
    from reproarchive.archive.job_archive import rank_records
    from reproarchive.format.schema import ConfigRecord, CudaInfo, GpuInfo, SystemRecord

    failures = failures or {}
    cuda = CudaInfo(available=True, version="13.0", device_count=1, devices=(GpuInfo(**H200),))

    def on_gpu(index):
        job, own, kept, ranks = index.job, None, [], []
        for rank in job.ranks:
            records = rank_records(index, rank)
            system = dataclasses.replace(records.system or SystemRecord(), cuda=cuda)
            records = dataclasses.replace(records, system=system, config=_inductor_changed(
                records.config or ConfigRecord(), changed.get(rank.rank, {})))
            if rank.rank in (guards or {}):
                records = dataclasses.replace(records, shapes=dataclasses.replace(
                    records.shapes, guards=tuple(guards[rank.rank])))
            outcome = rank.outcome
            if rank.rank in failures:
                outcome = dataclasses.replace(outcome, failure=failures[rank.rank])
            if rank.rank == job.primary_rank:
                own = dataclasses.replace(records, failure=failures.get(rank.rank, records.failure))
                ranks.append(dataclasses.replace(rank, records=None, outcome=outcome, device="cuda:0"))
                continue
            records = dataclasses.replace(records, failure=None)  # a rank's failure is its outcome's
            if records not in kept:
                kept.append(records)
            ranks.append(dataclasses.replace(rank, records=kept.index(records), outcome=outcome, device="cuda:0"))
        return dataclasses.replace(index, records=own, job=dataclasses.replace(job, ranks=tuple(ranks),
                                                                               records=tuple(kept)))

    moved = with_storage_devices(source, destination.with_suffix(".moved"), "cuda:0")
    try:
        return rewritten(moved, destination, on_gpu)
    finally:
        moved.unlink()

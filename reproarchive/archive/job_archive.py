"""``load_job`` and ``pack_job``: a multi-rank job archive (spec §8 ``job``) <-> every rank's
graph and inputs.

``load`` sees one rank of a job archive (the primary: the failing rank, else the lowest), so
every single-process tool keeps working. ``load_job`` rebuilds all of them: per rank its graph,
its inputs on fresh storages of its own (ranks are separate processes; nothing is shared between
two ranks' tensors even where the archive stores their bytes once) and its typed records. It
builds and runs nothing distributed: a graph whose collectives name process groups runs only
where those groups exist (``codec.collectives``), which is the launcher's job.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch.fx as fx

from reproarchive.archive.job_merge import merge_parts
from reproarchive.archive.loading import Repro, _torch_errors_as_archive_errors, rebuild
from reproarchive.archive.packing import pack
from reproarchive.codec.checks import check_readable_here, recorded_devices
from reproarchive.codec.devices import resolve_devices
from reproarchive.codec.stand_ins import install as install_stand_ins
from reproarchive.errors import ReproArchiveError
from reproarchive.format import layout
from reproarchive.format.layout import Limits
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import (
    GraphRecord,
    Index,
    JobRecord,
    MeshRecord,
    ProcessGroupRecord,
    RankOutcome,
    RankRecord,
    Records,
)


def _of_record(name: str) -> property:
    """A ``RankRepro`` attribute read from its ``RankRecord``."""
    return property(lambda self: getattr(self.record, name))


@dataclasses.dataclass
class RankRepro(Repro):
    """One rank of a loaded job: a ``Repro`` of its graph and inputs (on this process's
    devices), so that every consumer of one graph (``runner.replay_repro`` above all) takes a
    rank as it is, with the rank's own record.

    ``records`` are the rank's own (config, environment, execution state, shape policy, RNG:
    the index's unless the rank recorded others, 1.5), its failure the one its outcome
    records, what its replay is judged against; ``input_records`` its inputs' records;
    ``dtensors`` names the inputs that were DTensors (the stored tensor is the local shard; the
    record says the mesh and placements); ``schedule`` the collectives its graphs issue in order."""

    record: RankRecord | None = None
    own_records: Records = dataclasses.field(default_factory=Records)

    @property
    def records(self) -> Records:
        return self.own_records

    @property
    def input_records(self) -> tuple:
        return rank_inputs(self.index, self.record)

    # the rank's own facts, as its record holds them
    rank = _of_record("rank")
    local_rank = _of_record("local_rank")
    device = _of_record("device")
    host = _of_record("host")
    outcome = _of_record("outcome")
    schedule = _of_record("schedule")
    compiles = _of_record("compiles")
    dtensors = _of_record("dtensors")

    @property
    def notes(self) -> list[str]:
        """What loading it warned of (given once for the job, not once per rank)."""
        return self.warnings


@dataclasses.dataclass
class JobRepro:
    """A loaded multi-rank job archive: ``ranks`` in rank order, and the job's typed records."""

    path: Path
    digest: str
    index: Index
    job: JobRecord
    ranks: list[RankRepro]

    @property
    def world_size(self) -> int:
        return self.job.world_size

    @property
    def backend(self) -> str | None:
        return self.job.backend

    @property
    def on_fake_group(self) -> bool:
        return self.job.on_fake_group

    @property
    def groups(self) -> tuple[ProcessGroupRecord, ...]:
        return self.job.groups

    @property
    def meshes(self) -> tuple[MeshRecord, ...]:
        return self.job.meshes

    @property
    def mesh(self) -> MeshRecord | None:
        """The job's DeviceMesh when it has exactly one (the common case), else None."""
        return self.job.meshes[0] if len(self.job.meshes) == 1 else None

    @property
    def failing_rank(self) -> int | None:
        return self.job.failing_rank

    @property
    def primary_rank(self) -> int:
        return self.job.primary_rank

    @property
    def records(self) -> Records:
        """The index's own records: the primary rank's (each rank's own are ``RankRepro.records``)."""
        return self.index.records

    @property
    def rng_states(self) -> dict:
        """The primary rank's generator states, as ``Repro.rng_states``."""
        return self.rank(self.primary_rank).rng_states

    def rank(self, r: int) -> RankRepro:
        for rank in self.ranks:
            if rank.rank == r:
                return rank
        raise KeyError(f"the job archive records no rank {r} (it has {[x.rank for x in self.ranks]})")


def rank_graph(index: Index, rank: RankRecord) -> GraphRecord:
    """The graph record a rank ran: the index's own unless the rank names one of ``job.graphs``."""
    return index.graph if rank.graph is None else index.job.graphs[rank.graph]


def rank_inputs(index: Index, rank: RankRecord) -> tuple:
    """The input records of a rank: its own, else the index's."""
    return index.inputs if rank.inputs is None else rank.inputs


def rank_records(index: Index, rank: RankRecord | int) -> Records:
    """The records of a rank (its record, or its number): its own (1.5), else the index's, with
    the failure its outcome records (what a replay of the rank is judged against)."""
    if isinstance(rank, int):
        rank = job_rank(index, rank)
    records = index.records if rank.records is None else index.job.records[rank.records]
    return dataclasses.replace(records, failure=rank.outcome.failure if rank.outcome is not None else None)


def job_rank(index: Index, rank: int) -> RankRecord:
    """Rank ``rank``'s record of a job archive (a single-graph archive: rank 0 of one)."""
    job = index.job if index.job is not None else single_rank_job(index)
    for record in job.ranks:
        if record.rank == rank:
            return record
    raise ReproArchiveError(f"the archive records no rank {rank} (it has {sorted(r.rank for r in job.ranks)})",
                            "name one of its ranks")


def single_rank_job(index: Index) -> JobRecord:
    """The job record a single-process archive stands for: one rank, rank 0, its own outcome."""
    failure = index.records.failure
    outcome = RankOutcome(status="failed" if failure is not None else "unknown", failure=failure)
    return JobRecord(world_size=1, primary_rank=0, failing_rank=0 if failure is not None else None,
                     ranks=(RankRecord(rank=0, outcome=outcome),))


@_torch_errors_as_archive_errors
def load_job(path: str | os.PathLike, *, device=None, limits: Limits = layout.DEFAULT_LIMITS,
             max_memory: int | None = None, ranks: Sequence[int] | None = None, remap_graph: bool = True) -> JobRepro:
    """Every rank of a job archive (or those of ``ranks``: a rank worker reads its own), rebuilt
    in this process by ``loading.rebuild``, as ``load`` rebuilds one graph: custom ops stood in
    for, Triton launches bound, inference inputs, generated inputs within their demands (nothing
    runs). ``device`` and ``remap_graph`` as for ``load``. A single-process archive loads as a job
    of one rank (rank 0)."""
    with ContainerReader(path, limits=limits) as reader:
        index = reader.index
        stood_in = install_stand_ins(index.custom_ops or ())  # before the targets are checked, as ``load`` does
        check_readable_here(index, replaying=False)
        job = index.job if index.job is not None else single_rank_job(index)
        plan = resolve_devices(recorded_devices(index), device, missing="cpu")  # checked once, for every rank
        loaded = []
        for rank in sorted(job.ranks, key=lambda r: r.rank):
            if ranks is not None and rank.rank not in ranks:
                continue
            records = rank_records(index, rank)
            # its notes are given below, each once for the job, not once per rank
            built = rebuild(reader, rank_graph(index, rank), rank_inputs(index, rank), records, device=plan,
                            max_memory=max_memory, stood_in=stood_in, path=path, warn=False, remap_graph=remap_graph)
            loaded.append(RankRepro(
                built.gm, built.args, Path(path), reader.index_digest, index, built.fidelity, built.devices,
                built.notes, built.custom_ops, built.stand_ins, built.rng_states, record=rank, own_records=records))
        for note in dict.fromkeys(n for r in loaded for n in r.notes):
            warnings.warn(note, stacklevel=3)
        return JobRepro(Path(path), reader.index_digest, index, job, loaded)


@dataclasses.dataclass(frozen=True)
class RankCapture:
    """What one rank contributes to ``pack_job``: its graph, inputs (DTensor inputs already
    replaced by their local shards, ``record.dtensors`` saying what they were), records and
    rank record (its ``graph`` and ``inputs`` fields are filled by the packing)."""

    gm: fx.GraphModule
    inputs: Sequence[Any]
    record: RankRecord
    records: Records | None = None
    rng_states: Any = None  # the generator states its call started from (``pack``'s)
    custom_ops: Any = None  # its custom ops' (and Triton kernels') recorded calls (``pack``'s)


def rank_part_job(rank: RankRecord, *, world_size: int, backend: str | None,
                  groups: Sequence[ProcessGroupRecord] = (), meshes: Sequence[MeshRecord] = ()) -> JobRecord:
    """The job record of one rank's part: the job's facts, and this rank as its only (primary) rank."""
    rank = dataclasses.replace(rank, graph=None, inputs=None, records=None)  # in a part, all are the index's
    failing = rank.rank if rank.outcome is not None and rank.outcome.status in ("failed", "crashed", "timeout") \
        else None
    return JobRecord(world_size=world_size, primary_rank=rank.rank, backend=backend, failing_rank=failing,
                     groups=tuple(groups), meshes=tuple(meshes), ranks=(rank,))


def pack_job(ranks: Sequence[RankCapture], path: str | os.PathLike, *, world_size: int, backend: str | None = None,
             groups: Sequence[ProcessGroupRecord] = (), meshes: Sequence[MeshRecord] = ()) -> Path:
    """One job archive from the graphs and inputs of several ranks held in this process (tests,
    golden vectors, a source that has every rank at hand): each is packed as its part, then the
    parts are merged (``job_merge``), so this writes what a captured job writes."""
    with tempfile.TemporaryDirectory(prefix="reproarchive-job-") as tmp:
        parts = []
        for rc in ranks:
            part = Path(tmp) / f"rank-{rc.record.rank}.tar.zst"
            job = rank_part_job(rc.record, world_size=world_size, backend=backend, groups=groups, meshes=meshes)
            pack(rc.gm, list(rc.inputs), part, records=rc.records, job=job, rng_states=rc.rng_states,
                 custom_ops=rc.custom_ops)
            parts.append(part)
        return merge_parts(parts, path)

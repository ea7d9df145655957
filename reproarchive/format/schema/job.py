"""The ranks of a multi-rank job (spec §8 ``job``, 1.3), part of the schema: process groups,
meshes, DTensor inputs, collectives, compiles, each rank's record and outcome.

Data only, like every schema module (``schema_check`` refuses anything else here).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any  # noqa: F401 - open records' ``extra`` field type is resolved here

from reproarchive.format.plain import omit_none, open_record
from reproarchive.format.schema.graph import GraphRecord
from reproarchive.format.schema.sections import FailureRecord, Records
from reproarchive.format.schema.sets import PlacementKind, RankStatus
from reproarchive.format.schema.values import Value

# -- §8 job: the ranks of a multi-rank job (1.3) ------------------------------------------------


@open_record
class ProcessGroupRecord:
    """One process group as torch.distributed named it: ``name`` (what a graph's collectives
    pass, ``group_name``), its members as global ``ranks`` (in group-rank order), ``backend``
    (``gloo``, ``nccl``), ``index`` (creation order: a replay creates groups in this order, so
    counter names come out the same), ``desc`` (torch's ``group_desc``) and, for a DeviceMesh
    dimension's group, that dimension's name (``mesh_dim``)."""

    name: str
    ranks: tuple[int, ...]
    backend: str | None = omit_none()
    index: int | None = omit_none()
    desc: str | None = omit_none()
    mesh_dim: str | None = omit_none()


@open_record
class MeshRecord:
    """A DeviceMesh: ``shape``, its global ``ranks`` in row-major order, ``dim_names`` and
    ``device_type``; each dimension's groups are the table's groups with that ``mesh_dim``."""

    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    dim_names: tuple[str, ...] | None = omit_none()
    device_type: str | None = omit_none()


@open_record
class PlacementRecord:
    """A DTensor placement along one mesh dimension: ``shard`` (``dim``), ``replicate`` or
    ``partial`` (``reduce_op``)."""

    kind: PlacementKind
    dim: int | None = omit_none()
    reduce_op: str | None = omit_none()


@open_record
class DTensorInput:
    """A rank's input that was a DTensor: the stored tensor is its local shard; ``mesh`` is an
    index into ``job.meshes``, one placement per mesh dimension, and the global ``shape`` and
    ``stride``."""

    input: int
    mesh: int
    placements: tuple[PlacementRecord, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@open_record
class CollectiveRecord:
    """One collective a rank's graph issues, in graph order: the operator (``all_reduce``),
    the group's recorded name, the tensors it sends (shapes and dtypes), the compile it belongs
    to and the node that calls it."""

    op: str
    group: str | None = omit_none()
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    compile_id: str | None = omit_none()
    node: str | None = omit_none()


@open_record
class CompileRecord:
    """One compile on a rank, in order: Dynamo's compile id, why it recompiled, cache hit or miss."""

    compile_id: str
    recompile_reasons: tuple[str, ...] = ()
    cache: str | None = omit_none()


@open_record
class RankOutcome:
    """How a rank ended (``status``), its failure record when it failed (or timed out), the
    signal or exit code of a crash, and what it was doing (``doing``: the collective it waited
    in, the graph it ran)."""

    status: RankStatus
    failure: FailureRecord | None = omit_none()
    signal: str | None = omit_none()
    exit_code: int | None = omit_none()
    doing: str | None = omit_none()


@open_record
class RankRecord:
    """One rank. ``graph`` absent: the index's own ``graph``; else an index into ``job.graphs``.
    ``inputs`` absent: the index's own ``inputs``; else this rank's, whose tensors point into the
    one storage table. ``records`` (1.5) absent: the index's own records (config, environment,
    system, execution state, shape policy, RNG ...) are this rank's too; else an index into
    ``job.records``, this rank's own. ``host`` is a digest of the host name, never the name."""

    rank: int
    local_rank: int | None = omit_none()
    device: str | None = omit_none()
    host: str | None = omit_none()
    graph: int | None = omit_none()
    inputs: tuple[Value, ...] | None = omit_none()
    dtensors: tuple[DTensorInput, ...] = field(default=(), metadata={"omit": "empty"})
    schedule: tuple[CollectiveRecord, ...] = ()
    compiles: tuple[CompileRecord, ...] = field(default=(), metadata={"omit": "empty"})
    outcome: RankOutcome | None = omit_none()
    records: int | None = omit_none()  # (1.5)


#: The backend name of PyTorch's fake process group (``init_process_group("fake", ...)``): one
#: process plays one rank, the collectives return made-up values, the other ranks never run.
FAKE_PROCESS_GROUP = "fake"


@open_record
class JobRecord:
    """(1.3) A multi-rank job: the index's own graph and inputs are rank ``primary_rank``'s (the
    failing rank, else rank 0), so a single-process reader sees a valid archive; ``ranks`` holds
    every rank recorded, ``graphs`` the distinct graphs that are not the index's own, ``records``
    (1.5) the distinct records of ranks whose records are not the index's own (each stored once,
    however many ranks share it; a rank's failure is in its ``outcome``, not here)."""

    world_size: int
    primary_rank: int
    backend: str | None = omit_none()
    failing_rank: int | None = omit_none()
    groups: tuple[ProcessGroupRecord, ...] = ()
    meshes: tuple[MeshRecord, ...] = field(default=(), metadata={"omit": "empty"})
    graphs: tuple[GraphRecord, ...] = field(default=(), metadata={"omit": "empty"})
    ranks: tuple[RankRecord, ...] = ()
    records: tuple[Records, ...] = field(default=(), metadata={"omit": "empty"})  # (1.5)

    @property
    def on_fake_group(self) -> bool:
        """Recorded on PyTorch's fake process group: its ranks' replay, minify and export are
        that rank alone against the fake group, as it ran; the other ranks never ran."""
        return self.backend == FAKE_PROCESS_GROUP

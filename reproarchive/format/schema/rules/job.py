"""The rules of the ``job`` record (spec §8 "job", 1.3, rules R8-3 … R8-5): the ranks of a
multi-rank job, checked once when the index is decoded, like every other section.

A job record points into the rest of the index: its ranks' inputs into the one storage table,
its ranks' graphs into ``job.graphs``, their records (1.5) into ``job.records``, its
collectives and meshes into the group table. These checks make each of those references good,
and a rank's own records pass the same rules as the index's, so ``archive.job`` builds ranks
without re-checking.
"""

from __future__ import annotations

import math
from typing import Any

from reproarchive.errors import LimitExceededError, Rule, SchemaViolation
from reproarchive.format.layout import Limits
from reproarchive.format.schema import JobRecord, NodeOp, RankRecord, StorageRecord


def job_node_count(raw_job: Any, count_nodes) -> int:
    """Nodes of the job's own graphs as msgpack decoded them, before anything is checked."""
    graphs = raw_job.get("graphs") if isinstance(raw_job, dict) else None
    return sum(count_nodes(g, 0) for g in graphs) if isinstance(graphs, list) else 0


def check_job(job: JobRecord, storages: tuple[StorageRecord, ...], inputs: tuple, caps: Limits,
              check_value, check_graph, check_records) -> None:
    """Every rule of §8 ``job`` in order; ``check_value`` and ``check_graph`` are §6.3's and §7's,
    ``check_records(records, inputs)`` §8's rules of a record set over a rank's inputs."""
    _check_ranks(job)
    _check_groups(job)
    if max(len(job.graphs), len(job.records)) > caps.max_members:
        raise LimitExceededError(f"the job declares {len(job.graphs)} graphs and {len(job.records)} record sets, "
                                 f"more than the limit {caps.max_members}", rule=Rule.JOB_REFS)
    for g, graph in enumerate(job.graphs):
        check_graph(graph, storages, ("job", "graphs", g), 0)
    for i, rank in enumerate(job.ranks):
        _check_rank_refs(job, rank, i, storages, len(inputs), check_value)
        if rank.records is not None:
            try:
                check_records(job.records[rank.records], inputs if rank.inputs is None else rank.inputs)
            except SchemaViolation as exc:
                raise SchemaViolation(exc.problem, ("job", "records", rank.records, *exc.path), exc.rule) from None


def _bad(problem: str, rule: Rule, *path) -> SchemaViolation:
    return SchemaViolation(problem, ("job", *path), rule)


def _check_ranks(job: JobRecord) -> None:
    if not 1 <= job.world_size < 1 << 24:
        raise _bad(f"{job.world_size} is not a world size", Rule.JOB_RANKS, "world_size")
    seen: set[int] = set()
    for i, rank in enumerate(job.ranks):
        if not 0 <= rank.rank < job.world_size:
            raise _bad(f"rank {rank.rank} is outside the world of {job.world_size}", Rule.JOB_RANKS, "ranks", i)
        if rank.rank in seen:
            raise _bad(f"rank {rank.rank} appears twice", Rule.JOB_RANKS, "ranks", i)
        seen.add(rank.rank)
    if job.primary_rank not in seen:
        raise _bad(f"names rank {job.primary_rank}, which the job does not record", Rule.JOB_RANKS, "primary_rank")
    if job.failing_rank is not None and job.failing_rank not in seen:
        raise _bad(f"names rank {job.failing_rank}, which the job does not record", Rule.JOB_RANKS, "failing_rank")


def _check_members(ranks: tuple[int, ...], world_size: int, path: tuple) -> None:
    if len(set(ranks)) != len(ranks) or not all(0 <= r < world_size for r in ranks):
        raise _bad(f"members must be distinct ranks below {world_size}", Rule.JOB_GROUPS, *path)


def _check_groups(job: JobRecord) -> None:
    names: set[str] = set()
    for i, group in enumerate(job.groups):
        if group.name in names:
            raise _bad(f"group name {group.name[:60]!r} appears twice", Rule.JOB_GROUPS, "groups", i)
        names.add(group.name)
        _check_members(group.ranks, job.world_size, ("groups", i, "ranks"))
    for m, mesh in enumerate(job.meshes):
        _check_members(mesh.ranks, job.world_size, ("meshes", m, "ranks"))
        if math.prod(mesh.shape) != len(mesh.ranks) or any(s < 1 for s in mesh.shape):
            raise _bad(f"shape {list(mesh.shape)} does not hold its {len(mesh.ranks)} ranks", Rule.JOB_GROUPS,
                       "meshes", m, "shape")
        if mesh.dim_names is not None and len(mesh.dim_names) != len(mesh.shape):
            raise _bad("needs one name per dimension", Rule.JOB_GROUPS, "meshes", m, "dim_names")
    for i, rank in enumerate(job.ranks):
        for c, coll in enumerate(rank.schedule):
            if coll.group is not None and coll.group not in names:
                raise _bad(f"collective on group {coll.group[:60]!r}, which the group table lacks", Rule.JOB_GROUPS,
                           "ranks", i, "schedule", c)


def _check_rank_refs(job: JobRecord, rank: RankRecord, i: int, storages, n_inputs: int, check_value) -> None:
    where = ("ranks", i)
    primary = rank.rank == job.primary_rank
    if primary and (rank.graph is not None or rank.inputs is not None or rank.records is not None):
        raise _bad("the primary rank's graph, inputs and records are the index's own", Rule.JOB_REFS, *where)
    if rank.records is not None and not 0 <= rank.records < len(job.records):
        raise _bad(f"record set {rank.records} does not exist", Rule.JOB_REFS, *where, "records")
    if rank.graph is not None and not 0 <= rank.graph < len(job.graphs):
        raise _bad(f"graph {rank.graph} does not exist", Rule.JOB_REFS, *where, "graph")
    for j, value in enumerate(rank.inputs or ()):
        check_value(value, storages, ("job", *where, "inputs", j), 0)
    graph = job.graphs[rank.graph] if rank.graph is not None else None
    placeholders = (sum(1 for n in graph.nodes if n.op == NodeOp.PLACEHOLDER) if graph is not None else None)
    count = len(rank.inputs) if rank.inputs is not None else n_inputs
    if placeholders is not None and placeholders != count or placeholders is None and count != n_inputs:
        raise _bad(f"the rank's graph has {placeholders if placeholders is not None else n_inputs} placeholders "
                   f"but it stores {count} inputs", Rule.JOB_REFS, *where, "inputs")
    for d, dt in enumerate(rank.dtensors):
        if not 0 <= dt.input < count:
            raise _bad(f"names input {dt.input}, but the rank has {count}", Rule.JOB_REFS, *where, "dtensors", d)
        if not 0 <= dt.mesh < len(job.meshes):
            raise _bad(f"mesh {dt.mesh} does not exist", Rule.JOB_REFS, *where, "dtensors", d)
        if len(dt.placements) != len(job.meshes[dt.mesh].shape) or len(dt.shape) != len(dt.stride):
            raise _bad("needs one placement per mesh dimension and one stride per dimension", Rule.JOB_REFS,
                       *where, "dtensors", d)

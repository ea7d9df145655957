"""One archive for a multi-rank job (spec §8 ``job``), merged from the archives of its ranks.

Every rank of a job writes its own *part*: an ordinary archive of its graph and inputs whose
``job`` record lists that one rank (world size, group table, schedule, outcome). A part is
valid on its own, so a job whose other ranks never wrote (a crash, a launcher that killed them)
still leaves something to read. ``merge_parts`` joins parts (or job archives) into one archive
at the level of records and blobs: nothing is unpickled or rebuilt, blob bytes are copied as
stored after their digest is checked, identical storages of two ranks become one storage record
and one blob, and identical graphs one graph record. The primary rank (the failing rank, else
the lowest) keeps the index's own graph, inputs and records, so every single-process reader
sees a valid archive of the rank that failed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reproarchive.context.failure import says_a_peer_went_away
from reproarchive.errors import DigestMismatchError, PackError, SchemaViolation
from reproarchive.format import digests, layout
from reproarchive.format.atomic import atomic_file
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import (
    ContainerRecord,
    CustomOpRecord,
    GraphRecord,
    Index,
    JobRecord,
    MeshRecord,
    ProcessGroupRecord,
    RankOutcome,
    RankRecord,
    RankStatus,
    Records,
    SequenceValue,
    StorageRecord,
    SubgraphEntry,
    TensorEntry,
    TensorValue,
    TritonKernelRecord,
)
from reproarchive.format.writer import ContainerWriter

#: Which outcome makes a rank the failing one, most telling first: its own exception, then a
#: crash, then a collective timeout (a rank that times out waits for one that went elsewhere),
#: then an exception that only says a peer went away (it failed because another rank did).
_FAILING = (RankStatus.FAILED, RankStatus.CRASHED, RankStatus.TIMEOUT)


def lost_a_peer(outcome: RankOutcome | None) -> bool:
    """Whether a rank's failure only says that another rank went away (gloo's "Connection closed
    by peer", NCCL's aborted communicator): a consequence, not the cause."""
    failure = outcome.failure if outcome is not None else None
    return failure is not None and says_a_peer_went_away(failure.message)


@dataclasses.dataclass
class _Rank:
    """One rank as found in a part: its record, graph and inputs, and where its storages live."""

    record: RankRecord
    graph: GraphRecord
    inputs: tuple
    part: int
    records: Records  # its own: the part's, or its entry of a job archive's ``job.records``


def failing_rank(ranks: Sequence[RankRecord]) -> int | None:
    """The rank whose failure a job archive reports: by ``_FAILING`` order, then the lowest."""
    for status in _FAILING:
        found = sorted(r.rank for r in ranks if r.outcome is not None and r.outcome.status == status
                       and not lost_a_peer(r.outcome))
        if found:
            return found[0]
    lost = sorted(r.rank for r in ranks if r.outcome is not None and r.outcome.status in _FAILING)
    return lost[0] if lost else None


def merge_parts(parts: Sequence[str | os.PathLike], path: str | os.PathLike, *,
                outcomes: Mapping[int, RankOutcome] | None = None, jobs: Mapping[int, JobRecord] | None = None) -> Path:
    """Write one job archive at ``path`` from ``parts`` (rank parts or job archives of disjoint
    ranks of one job); returns ``path``. ``outcomes``: how ranks ended where their part does not
    say (it was written before the end: a status or a signal learned since). ``jobs``: by position
    in ``parts``, the one-rank job record of a part written without one (a single-process archive
    of one rank, such as a TORCH_TRACE compile's; ``archive.job.rank_part_job``). The index's own
    ``failure`` is the primary rank's when its outcome has one. Raises ``PackError`` when the
    parts are not of one job."""
    if not parts:
        raise PackError("no rank parts to merge", "pass the archives the ranks of the job wrote")
    with contextlib.ExitStack() as stack:
        readers = [stack.enter_context(ContainerReader(p)) for p in parts]
        indexes = [r.index if r.index.job is not None or p not in (jobs or {}) else
                   dataclasses.replace(r.index, job=jobs[p]) for p, r in enumerate(readers)]
        ranks = _ranks(indexes, parts)
        for rank in ranks:
            if outcomes and rank.record.rank in outcomes:
                rank.record = dataclasses.replace(rank.record, outcome=outcomes[rank.record.rank])
        world_size, backend = _world(indexes, parts)
        failing = failing_rank([r.record for r in ranks])
        primary = failing if failing is not None else min(r.record.rank for r in ranks)
        ranks.sort(key=lambda r: (r.record.rank != primary, r.record.rank))
        table = _Storages(indexes)
        first = indexes[ranks[0].part]
        job_ranks, graphs, top_graph, top_inputs, records, rank_records = _renumbered_ranks(ranks, table)
        groups, meshes, mesh_maps = _groups_and_meshes(indexes)
        custom_ops, kernels = _custom_ops(indexes, table), _triton_kernels(indexes, table)
        job_ranks = [dataclasses.replace(r, dtensors=tuple(dataclasses.replace(d, mesh=mesh_maps[part][d.mesh])
                                                           for d in r.dtensors))
                     for r, part in zip(job_ranks, (r.part for r in ranks))]
        job = JobRecord(world_size=world_size, primary_rank=primary, backend=backend, failing_rank=failing,
                        groups=groups, meshes=meshes, graphs=tuple(graphs), ranks=tuple(job_ranks),
                        records=tuple(rank_records))
        outcome = ranks[0].record.outcome
        if outcome is not None and outcome.failure is not None:
            records = dataclasses.replace(records, failure=outcome.failure)
        index = Index(container=ContainerRecord(frame_size=first.container.frame_size),
                      digest_algorithm=first.digest_algorithm, storages=tuple(table.records),
                      inputs=top_inputs, graph=top_graph, records=records, job=job,
                      custom_ops=custom_ops or None, triton_kernels=kernels or None)
        code = readers[ranks[0].part].read_member(layout.GRAPH_CODE_MEMBER) \
            if layout.GRAPH_CODE_MEMBER in readers[ranks[0].part].members else b""
        _write(path, index, code, table, readers)
    return Path(path)


def _ranks(indexes: list[Index], parts) -> list[_Rank]:
    out: list[_Rank] = []
    seen: dict[int, Any] = {}
    for p, index in enumerate(indexes):
        if index.job is None:
            raise PackError(f"{parts[p]} is not a rank of a multi-rank job (it has no job record)",
                            "merge only the parts that the ranks of one job wrote")
        for rank in index.job.ranks:
            if rank.rank in seen:
                raise PackError(f"rank {rank.rank} is in both {seen[rank.rank]} and {parts[p]}",
                                "merge one part per rank (the newest)")
            seen[rank.rank] = parts[p]
            graph = index.graph if rank.graph is None else index.job.graphs[rank.graph]
            inputs = index.inputs if rank.inputs is None else rank.inputs
            records = index.records if rank.records is None else index.job.records[rank.records]
            out.append(_Rank(dataclasses.replace(rank, records=None), graph, inputs, p, records))
    return out


def _world(indexes: list[Index], parts) -> tuple[int, str | None]:
    sizes = {index.job.world_size for index in indexes}
    if len(sizes) != 1:
        raise PackError(f"the parts are of jobs of different world sizes ({sorted(sizes)})",
                        "merge only the parts of one job (one folder per job)")
    backends = [index.job.backend for index in indexes if index.job.backend is not None]
    return sizes.pop(), backends[0] if backends else None


class _Storages:
    """The one storage table of the merged archive. A rank's storages map to new records; a
    storage another rank already stored with the same bytes (digest, size, device) is shared,
    unless this rank uses that record already (two storages of one rank stay two: aliasing
    within a rank is part of what it recorded)."""

    def __init__(self, indexes: list[Index]):
        self.indexes = indexes
        self.records: list[StorageRecord] = []
        self.source: list[tuple[int, StorageRecord]] = []  # (part, record) the bytes come from
        self._by_content: dict[tuple, list[int]] = {}

    def mapping(self, part: int, used: list[int]) -> dict[int, int]:
        mine: dict[int, int] = {}
        taken: set[int] = set()
        for old in used:
            if old in mine:
                continue
            rec = self.indexes[part].storages[old]
            key = (rec.digest, rec.fill, rec.size, rec.device, rec.fidelity) if rec.is_real else None
            shared = next((i for i in self._by_content.get(key, ()) if i not in taken), None) if key else None
            if shared is None:
                shared = len(self.records)
                self.records.append(rec)
                self.source.append((part, rec))
                if key:
                    self._by_content.setdefault(key, []).append(shared)
            mine[old] = shared
            taken.add(shared)
        return mine


def _renumber_value(value: Any, mine: dict[int, int]) -> Any:
    if isinstance(value, TensorValue):
        return dataclasses.replace(value, storage=mine[value.storage])
    if isinstance(value, SequenceValue):
        return dataclasses.replace(value, items=tuple(_renumber_value(v, mine) for v in value.items))
    return value


def _renumber_graph(graph: GraphRecord, mine: dict[int, int]) -> GraphRecord:
    state = []
    for entry in graph.module_state:
        if isinstance(entry, TensorEntry):
            entry = dataclasses.replace(entry, tensor=_renumber_value(entry.tensor, mine))
        elif isinstance(entry, SubgraphEntry):
            entry = dataclasses.replace(entry, graph=_renumber_graph(entry.graph, mine))
        state.append(entry)
    return dataclasses.replace(graph, module_state=tuple(state))


def _renumbered_ranks(ranks: list[_Rank], table: _Storages):
    """Each rank's record with its graph, inputs and records renumbered into the one table; the
    primary (first) rank's graph, inputs and records become the index's own; equal graphs, and
    equal records (a rank's failure is in its outcome, not in them), are stored once."""
    graphs: list[GraphRecord] = []
    out: list[RankRecord] = []
    top_graph: GraphRecord | None = None
    top_inputs: tuple = ()
    top_records: Records = Records()
    record_sets: list[Records] = []
    for k, rank in enumerate(ranks):
        used = [t.storage for v in rank.inputs for t in v.tensors()]
        used += [t.storage for t in rank.graph.tensors()]
        used += [g.storage for g in rank.records.rng.generators] if rank.records.rng is not None else []
        mine = table.mapping(rank.part, used)
        inputs = tuple(_renumber_value(v, mine) for v in rank.inputs)
        graph = _renumber_graph(rank.graph, mine)
        records = _renumbered_rng(rank.records, mine)
        if k == 0:
            top_graph, top_inputs, top_records = graph, inputs, records
            out.append(dataclasses.replace(rank.record, graph=None, inputs=None))
            continue
        own = dataclasses.replace(records, failure=None)
        if own == dataclasses.replace(top_records, failure=None):
            records_at = None
        else:
            if own not in record_sets:
                record_sets.append(own)
            records_at = record_sets.index(own)
        if graph == top_graph:
            where = None
        else:
            if graph not in graphs:
                graphs.append(graph)
            where = graphs.index(graph)
        same_inputs = where is None and inputs == top_inputs
        out.append(dataclasses.replace(rank.record, graph=where, inputs=None if same_inputs else inputs,
                                       records=records_at))
    return out, graphs, top_graph, top_inputs, top_records, record_sets


def _renumbered_rng(records: Any, mine: dict[int, int]) -> Any:
    """``records`` with its generator states pointing into the merged storage table."""
    if records.rng is None or not records.rng.generators:
        return records
    generators = tuple(dataclasses.replace(g, storage=mine[g.storage]) for g in records.rng.generators)
    return dataclasses.replace(records, rng=dataclasses.replace(records.rng, generators=generators))


def _custom_ops(indexes: list[Index], table: _Storages) -> tuple[CustomOpRecord, ...]:
    """Every rank's custom ops as one table (spec §8 ``custom_ops`` of a job): an operator once,
    with the calls of every rank (each distinct call once; a call is found by its arguments'
    content, so each rank's stand-in finds its own). Two ranks that name one operator with two
    schemas ran two programs: refused."""
    merged: dict[str, CustomOpRecord] = {}
    for part, index in enumerate(indexes):
        for op in index.custom_ops or ():
            mine = table.mapping(part, [t.storage for t in op.tensors()])
            calls = tuple(dataclasses.replace(c, outputs=tuple(_renumber_value(v, mine) for v in c.outputs))
                          for c in op.calls)
            have = merged.get(op.name)
            if have is None:
                merged[op.name] = dataclasses.replace(op, calls=calls)
                continue
            if have.schema != op.schema:
                raise PackError(f"the ranks recorded custom op {op.name} with two schemas ({have.schema!r} and "
                                f"{op.schema!r})", "merge only the parts of one job (one program on every rank)")
            known = {c.arguments for c in have.calls}
            merged[op.name] = dataclasses.replace(have, calls=have.calls + tuple(
                c for c in calls if c.arguments not in known))
    return tuple(merged[name] for name in sorted(merged))


def _triton_kernels(indexes: list[Index], table: _Storages) -> tuple[TritonKernelRecord, ...]:
    """Every rank's Triton kernels as one table, each kernel with the launches of every rank.
    A launch node names its kernel and call site by number (``kernel_idx``,
    ``constant_args_idx``), so the ranks' tables join only where they agree on what each number
    means (the same program on every rank numbers them alike); otherwise refused in one line."""
    merged: dict[int, TritonKernelRecord] = {}
    for part, index in enumerate(indexes):
        for kernel in index.triton_kernels or ():
            used = [t.storage for c in kernel.calls for v in c.written.values() for t in v.tensors()]
            mine = table.mapping(part, used)
            calls = tuple(dataclasses.replace(c, written={k: _renumber_value(v, mine) for k, v in c.written.items()})
                          for c in kernel.calls)
            have = merged.get(kernel.index)
            if have is None:
                merged[kernel.index] = dataclasses.replace(kernel, calls=calls)
                continue
            if (have.digest, have.constants) != (kernel.digest, kernel.constants):
                raise PackError(f"the ranks numbered their Triton kernels differently (kernel {kernel.index} is "
                                f"{have.name} on one rank and {kernel.name} with other call sites on another)",
                                "merge only the parts of one job (one program on every rank)")
            known = [(c.constants, c.arguments) for c in have.calls]
            merged[kernel.index] = dataclasses.replace(have, calls=have.calls + tuple(
                c for c in calls if (c.constants, c.arguments) not in known))
    return tuple(merged[i] for i in sorted(merged))


def _groups_and_meshes(indexes: list[Index]):
    """The union of the parts' group tables (by name, in creation order) and meshes; for each
    part, where its mesh indices went."""
    groups: dict[str, ProcessGroupRecord] = {}
    meshes: list[MeshRecord] = []
    maps: list[dict[int, int]] = []
    for index in indexes:
        for group in index.job.groups:
            known = groups.get(group.name)
            if known is None or known.mesh_dim is None and group.mesh_dim is not None:
                groups[group.name] = group
        mine = {}
        for m, mesh in enumerate(index.job.meshes):
            if mesh not in meshes:
                meshes.append(mesh)
            mine[m] = meshes.index(mesh)
        maps.append(mine)
    order = sorted(groups.values(), key=lambda g: (g.index if g.index is not None else 1 << 30, g.name))
    return tuple(order), tuple(meshes), maps


def _write(path, index: Index, code: bytes, table: _Storages, readers: list[ContainerReader]) -> None:
    with atomic_file(path) as f:
        writer = ContainerWriter(f, frame_size=index.container.frame_size)
        try:
            if code:
                writer.add_member(layout.GRAPH_CODE_MEMBER, code)
            written: set[str] = set()
            for part, rec in table.source:
                if rec.digest is None or rec.digest in written:
                    continue
                data = readers[part].read_member(digests.blob_member_name(rec.digest))
                algorithm, _ = digests.parse(rec.digest)
                if digests.of_bytes(data, algorithm) != rec.digest:
                    raise DigestMismatchError(f"blob {rec.digest} of a rank part does not match its digest",
                                              "the part is damaged; capture the job again")
                writer.add_member(digests.blob_member_name(rec.digest), data)
                written.add(rec.digest)
            try:
                writer.finish(index)
            except SchemaViolation as exc:
                raise PackError(f"the merged job archive cannot be stored: {exc}") from None
        except BaseException:
            writer.abandon()
            raise

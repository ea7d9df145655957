"""``decode_index`` and ``encode_index``: every rule of the index (spec §5 rules 6, 7 and 9, §6–§8)
in the order the spec lists them, each family's checker from its own module, and the rules of
the member list (§5 rule 7).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

from reproarchive.errors import IndexSchemaError, LimitExceededError, Rule, SchemaViolation, UnsafeArchiveError
from reproarchive.format import index_codec
from reproarchive.format.digests import DIGEST_RE
from reproarchive.format.layout import (
    DEFAULT_LIMITS,
    INDEX_MEMBER,
    LAYOUT_MEMBER,
    MAX_FRAME_SIZE,
    MIN_FRAME_SIZE,
    Limits,
    check_member_name,
    is_blob_name,
)
from reproarchive.format.plain import decoder_for, encode
from reproarchive.format.schema import (
    FORMAT_NAME,
    MAX_GRAPH_DEPTH,
    ContainerRecord,
    CustomOpRecord,
    DerivedValue,
    DigestAlgorithm,
    GraphRecord,
    Index,
    JobRecord,
    NodeOp,
    Records,
    StorageRecord,
    TritonKernelRecord,
    Value,
)
from reproarchive.format.schema.rules.graph import check_graph
from reproarchive.format.schema.rules.job import check_job, job_node_count
from reproarchive.format.schema.rules.records import check_failure, check_rank_records, check_rng, check_shapes
from reproarchive.format.schema.rules.triton import check_triton_kernels
from reproarchive.format.schema.rules.values import check_derived, check_storages, check_value

_ALGORITHMS = frozenset(DigestAlgorithm)


# -- reading and writing -------------------------------------------------------------------------


def decode_index(data: bytes, limits: Limits, version: tuple[int, int]) -> Index:
    """Index member bytes -> a checked ``Index``, rules in the order of spec §5.1–§8.

    ``version`` is the footer's (major, minor); the index must agree with it. Raises
    ``IndexSchemaError`` (or ``LimitExceededError``, ``UnsafeArchiveError``) naming the first
    rule that fails.
    """
    raw = index_codec.decode_index(data, max_memory=limits.max_index_memory)
    try:
        return _checked(raw, limits, version)
    except SchemaViolation as exc:
        raise IndexSchemaError(f"index field {exc.where} is invalid: {exc.problem}",
                               "the archive is damaged or was written by a broken tool",
                               rule=exc.rule or Rule.FIELD_TYPES) from None


def encode_index(index: Index, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """The mirror of ``decode_index``: the same rules, then canonical msgpack (spec §5.1).
    Raises ``SchemaViolation``; ``pack`` reports it as a ``PackError``."""
    raw = encode(index)
    _checked(raw, limits, _parse_version(index.version))
    return index_codec.encode_index(raw)


def _parse_version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor)


def _checked(raw: Any, caps: Limits, version: tuple[int, int]) -> Index:
    container, algorithm = _header(raw, caps, version)
    storages, inputs = _storages_and_inputs(raw, container, caps)
    graph = _graph(raw, storages, inputs, caps)
    records, custom_ops = _records(raw, storages, inputs, caps)
    # §8 job (1.3): the ranks of a multi-rank job
    job = _section(raw, "job", JobRecord | None)
    if job is not None:
        check_job(job, storages, inputs, caps, check_value, check_graph,
                  lambda rank_records, rank_inputs: check_rank_records(rank_records, rank_inputs, storages))
    if records.rng is not None:
        check_rng(records.rng, storages)
    # §8 triton_kernels (1.4): after the job, whose graphs may launch them too
    triton_kernels = _section(raw, "triton_kernels", tuple[TritonKernelRecord, ...] | None)
    index = Index(container=container, digest_algorithm=algorithm, storages=storages, inputs=inputs, graph=graph,
                  records=records, format=FORMAT_NAME, version=raw["version"], job=job, custom_ops=custom_ops,
                  triton_kernels=triton_kernels)
    check_triton_kernels(index, caps, check_value)
    return index


def _header(raw: Any, caps: Limits, version: tuple[int, int]) -> tuple[ContainerRecord, Any]:
    """§5 rules 6 and 7, then §6.1: what the rest of the index is read with, so it comes first."""
    if not isinstance(raw, dict):
        raise SchemaViolation("the index is not a map", rule=Rule.INDEX_HEADER)
    # §5 rule 6: format and version
    if raw.get("format") != FORMAT_NAME:
        raise SchemaViolation(f"names format {str(raw.get('format'))[:40]!r}, expected {FORMAT_NAME!r}",
                              ("format",), Rule.INDEX_HEADER)
    if raw.get("version") != f"{version[0]}.{version[1]}":
        raise SchemaViolation("disagrees with the footer's format version", ("version",), Rule.INDEX_HEADER)
    # §5 rule 7: the member list (counts first, before anything is walked)
    container = _section(raw, "container", ContainerRecord)
    if len(container.members) > caps.max_members:
        raise LimitExceededError(f"archive declares {len(container.members)} members, more than the limit "
                                 f"{caps.max_members}", rule=Rule.MEMBERS)
    check_container(container, caps)
    # §6.1 digests
    algorithm = raw.get("digest_algorithm")
    if algorithm not in _ALGORITHMS:
        raise SchemaViolation(f"unknown digest algorithm {str(algorithm)[:20]!r}", ("digest_algorithm",),
                              Rule.DIGEST_ALGORITHM)
    return container, algorithm


def _storages_and_inputs(raw: dict, container: ContainerRecord, caps: Limits) -> tuple[tuple, tuple]:
    """§6.2 and §6.3, each counted against the limit before its entries are walked."""
    # §6.2 storages
    storages = _section(raw, "storages", tuple[StorageRecord, ...])
    if len(storages) > caps.max_members:
        raise LimitExceededError(f"index declares {len(storages)} storages, more than the limit {caps.max_members}",
                                 rule=Rule.STORAGE_TOTAL)
    check_storages(storages, container, caps)
    # §6.3 inputs
    inputs = _section(raw, "inputs", tuple[Value, ...])
    if len(inputs) > caps.max_members:
        raise LimitExceededError(f"index declares {len(inputs)} inputs, more than the limit {caps.max_members}",
                                 rule=Rule.INPUTS)
    for i, value in enumerate(inputs):
        if isinstance(value, DerivedValue):
            check_derived(value, inputs, ("inputs", i))
        else:
            check_value(value, storages, ("inputs", i), 0)
    return storages, inputs


def _graph(raw: dict, storages: tuple, inputs: tuple, caps: Limits) -> GraphRecord:
    """§5 rule 9 and §7: the node count (the job's ranks included) before anything is decoded."""
    nodes = _raw_node_count(raw.get("graph"), 0) + job_node_count(raw.get("job"), _raw_node_count)
    if nodes > caps.max_nodes:
        raise LimitExceededError(f"the graph has {nodes} nodes, more than the limit {caps.max_nodes}",
                                 rule=Rule.INDEX_ORDER)
    graph = _section(raw, "graph", GraphRecord)
    check_graph(graph, storages, ("graph",), 0)
    placeholders = sum(1 for n in graph.nodes if n.op == NodeOp.PLACEHOLDER)
    if placeholders != len(inputs):
        raise SchemaViolation(f"the graph has {placeholders} placeholders but the index stores {len(inputs)} inputs",
                              ("inputs",), Rule.INPUTS)
    return graph


def _records(raw: dict, storages: tuple, inputs: tuple, caps: Limits) -> tuple[Records, Any]:
    """§8 up to the job: the records, and the custom ops' calls, whose outputs are values too."""
    hints = typing.get_type_hints(Records, include_extras=True)
    records = Records(**{f.name: _section(raw, f.name, hints[f.name]) for f in dataclasses.fields(Records)})
    if records.parent is not None and not DIGEST_RE.match(records.parent):
        raise SchemaViolation("is not <algorithm>:<hex digest>", ("parent",), Rule.DIGEST_SYNTAX)
    if records.failure is not None:
        check_failure(records.failure)
    custom_ops = _section(raw, "custom_ops", tuple[CustomOpRecord, ...] | None)
    if sum(len(op.calls) for op in custom_ops or ()) > caps.max_members:
        raise LimitExceededError(f"index records more than {caps.max_members} custom-op calls",
                                 rule=Rule.STORAGE_TOTAL)
    for i, op in enumerate(custom_ops or ()):
        for j, call in enumerate(op.calls):
            for k, value in enumerate(call.outputs):
                check_value(value, storages, ("custom_ops", i, "calls", j, "outputs", k), 0)
    execution = records.execution
    for i in (execution.inference_inputs or ()) if execution is not None else ():
        if not 0 <= i < len(inputs):
            raise SchemaViolation(f"names input {i}, but the index stores {len(inputs)} inputs",
                                  ("execution", "inference_inputs"), Rule.INPUTS)
    if records.shapes is not None:
        check_shapes(records.shapes, inputs)
    return records, custom_ops


def _raw_node_count(graph: Any, depth: int) -> int:
    """Nodes of a graph and its subgraphs as the msgpack decoded them, before any checking
    (a malformed graph counts what it can; the schema names its defect afterwards)."""
    if not isinstance(graph, dict) or depth > MAX_GRAPH_DEPTH:
        return 0
    nodes = graph.get("nodes")
    count = len(nodes) if isinstance(nodes, list) else 0
    state = graph.get("module_state")
    for entry in state if isinstance(state, list) else ():
        if isinstance(entry, dict) and entry.get("kind") == "graph":
            count += _raw_node_count(entry.get("graph"), depth + 1)
    return count


def _section(raw: dict, key: str, tp: Any):
    if key not in raw:
        if _allows_none(tp):
            return None
        raise SchemaViolation("is missing").at(key)
    try:
        return decoder_for(tp)(raw[key])
    except SchemaViolation as exc:
        raise exc.at(key) from None


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


# -- §5 rule 7: the member list ------------------------------------------------------------------


def check_container(container: ContainerRecord, caps: Limits) -> None:
    def bad(problem: str, *path) -> SchemaViolation:
        return SchemaViolation(problem, ("container", *path), Rule.MEMBERS)

    if not MIN_FRAME_SIZE <= container.frame_size <= MAX_FRAME_SIZE:
        raise bad(f"{container.frame_size} is outside [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE}]", "frame_size")
    if not container.members:
        raise bad("must list at least the layout member", "members")
    seen: set[str] = set()
    total = 0
    for i, m in enumerate(container.members):
        check_member_name(m.name)
        if m.name in seen or m.name == INDEX_MEMBER:
            raise UnsafeArchiveError(f"member {m.name!r} appears twice", "the archive is unsafe or damaged",
                                     rule=Rule.MEMBERS)
        seen.add(m.name)
        for key in ("size", "first_frame", "frames"):
            if getattr(m, key) < 0:
                raise bad(f"member {m.name!r} has a negative {key}", "members", i)
        if m.name.startswith("blobs/") and not is_blob_name(m.name):
            raise bad(f"member {m.name!r} is under blobs/ but is not named <algorithm>/<hex digest>")
        total += m.size
        if total > caps.max_total_bytes:
            raise LimitExceededError(f"members declare more than {caps.max_total_bytes} bytes in total",
                                     rule=Rule.MEMBERS)
    if container.members[0].name != LAYOUT_MEMBER:
        raise bad(f"the first member is {container.members[0].name!r}, not {LAYOUT_MEMBER!r}")

"""Collectives in a graph: which ones it issues, in order, and whether this process can run them.

A functional collective (``torch.ops._c10d_functional.all_reduce(x, "sum", "0")``) names its
process group by the string torch.distributed gave the group when it was created. The archive
records that name and the group's members (spec §8 ``job``); running the graph needs a process
in which a group of that name exists, that is, every rank launched and the groups recreated
under their recorded names. ``check_groups_joined`` is that condition, asked before a replay;
``verify`` and ``inspect`` run nothing and never ask it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from reproarchive.codec.operator_effects import COLLECTIVE_NAMESPACES
from reproarchive.codec.targets import qualified_name
from reproarchive.compat.distributed import resolve_process_group
from reproarchive.errors import NotReplayableHereError
from reproarchive.format.schema import GraphRecord, Index, NodeRecord, SubgraphEntry

_PREFIXES = tuple(f"torch.ops.{ns}." for ns in COLLECTIVE_NAMESPACES)


@dataclass(frozen=True)
class Collective:
    """One collective call of a graph: the node, the operator (``all_reduce``) and its group."""

    node: str
    op: str
    group: str | None


def _op_name(target: str) -> str | None:
    for prefix in _PREFIXES:
        if target.startswith(prefix):
            return target[len(prefix):].split(".")[0]
    return None


def _group_argument(op: str, namespace: str, args: tuple, kwargs: dict) -> str | None:
    """The ``group_name`` argument, found by the operator's schema (its position differs)."""

    if "group_name" in kwargs:
        value = kwargs["group_name"]
        return value if isinstance(value, str) else None
    packet = getattr(getattr(torch.ops, namespace, None), op, None)
    overload = getattr(packet, "default", None)
    if overload is None:
        return None
    names = [a.name for a in overload._schema.arguments if not a.kwarg_only]
    if "group_name" not in names or names.index("group_name") >= len(args):
        return None
    value = args[names.index("group_name")]
    return value if isinstance(value, str) else None


def _nodes(graph: GraphRecord):
    yield from graph.nodes
    for entry in graph.module_state:
        if isinstance(entry, SubgraphEntry):
            yield from _nodes(entry.graph)


def collective_of(node: NodeRecord | Any) -> Collective | None:
    """The collective a node (a record, or an fx node) calls, or None."""
    op_kind = str(node.op)
    if op_kind != "call_function":
        return None
    target = node.target if isinstance(node.target, str) else _qualified(node.target)
    op = _op_name(target or "")
    if op is None:
        return None
    namespace = target.split(".")[2]
    return Collective(node.name, op, _group_argument(op, namespace, tuple(node.args), dict(node.kwargs)))


def _qualified(target: Any) -> str | None:
    try:
        return qualified_name(target)
    except Exception:  # noqa: BLE001 - not a nameable target: not a collective
        return None


def graph_collectives(graph: GraphRecord) -> list[Collective]:
    """The collectives of a graph record, in node order (subgraphs after their parent's nodes)."""
    return [c for c in map(collective_of, _nodes(graph)) if c is not None]


def check_groups_joined(index: Index) -> None:
    """Raise ``NotReplayableHereError`` (exit 125) when the archive's graph calls a collective on a
    process group this process does not have: only a launch of the job's ranks replays it."""
    calls = [c for c in graph_collectives(index.graph) if c.op != "wait_tensor"]
    if not calls:
        return
    missing = [c for c in calls if not _group_exists(c.group)]
    if not missing:
        return
    first = missing[0]
    job = index.job
    ranks = f"all {job.world_size} ranks of its job" if job is not None else "the ranks that recorded it"
    raise NotReplayableHereError(
        f"the graph calls collective {first.op} on process group {first.group!r}, which this process has not "
        f"joined: it replays only with {ranks} launched, not in one process",
        "replay it with `reproarchive run ARCHIVE`, which launches the job's ranks (`verify` and `inspect` "
        "read it without running)")


def unjoined_collective(gm: Any) -> Collective | None:
    """The first collective an fx graph (its subgraphs included) calls on a process group this
    process has not joined, or None: a graph that issues one replays only as its job."""
    for module in gm.modules():
        for node in getattr(getattr(module, "graph", None), "nodes", ()):
            call = collective_of(node)
            if call is not None and call.op != "wait_tensor" and not _group_exists(call.group):
                return call
    return None


def _group_exists(name: str | None) -> bool:
    try:
        if name is None or not dist.is_available() or not dist.is_initialized():
            return False

        resolve_process_group(name)
        return True
    except Exception:  # noqa: BLE001 - any failure to resolve: the group is not here
        return False

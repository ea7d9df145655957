"""Which arguments of a higher-order operator are subgraphs, what each one is for, and which
values flow into its inputs: what ``view`` needs to draw ``cond`` as its two branches instead of
one opaque node with two attribute names.

An archive keeps a subgraph as data (spec §7: a ``graph`` entry of the module state, holding its
own nodes and, for a nested operator, its own subgraphs); the operator's node passes it as a
``get_attr`` node naming that entry. Nothing here is read from torch: the roles of the arguments
are the operators' documented signatures, written down once, and an operator not listed still has
its subgraphs found (by the ``get_attr`` arguments that name one), only without roles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reproarchive.format.schema import (
    ConstantArg,
    GraphRecord,
    NodeRecord,
    NodeRef,
    SubgraphEntry,
    TupleArg,
)
from reproarchive.format.schema.rules.graph import iter_arg_refs

HOP_PREFIX = "torch.ops.higher_order."


@dataclass(frozen=True)
class Binding:
    """What one input (placeholder) of a subgraph receives: an outer node (``node``), or a value
    the operator makes itself (``text``: flex_attention's ``score``, a slice of ``map``'s input)."""

    node: str | None
    text: str


@dataclass(frozen=True)
class SubgraphUse:
    """One subgraph an operator's node runs: its role (``true branch``), its module-state path,
    its graph and what each of its inputs is bound to (shorter than its inputs when unknown)."""

    role: str
    path: str
    graph: GraphRecord
    bindings: tuple[Binding, ...]


@dataclass(frozen=True)
class HopCall:
    """A higher-order operator's node: the operator (``cond``), the operator it calls when it is
    given one as a value (``with_effects``, ``auto_functionalized``), and its subgraphs."""

    node: str
    operator: str
    calls: str | None
    subgraphs: tuple[SubgraphUse, ...]

    @property
    def label(self) -> str:
        """What its box says: ``cond``; ``with_effects: rafx.tick`` for one given an operator."""
        return f"{self.operator}: {short_operator(self.calls)}" if self.calls else self.operator


def _items(value: Any) -> list:
    if isinstance(value, TupleArg):
        return list(value.items)
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _operands(value: Any, how: str = "") -> list[Binding]:
    out = []
    for v in _items(value):
        if isinstance(v, (TupleArg, list, tuple)):
            out += _operands(v, how)
        elif isinstance(v, NodeRef):
            out.append(Binding(v.name, f"{how}{v.name}"))
        else:
            out.append(Binding(None, f"{how}{v!r}"))
    return out


def _given(*names: str) -> list[Binding]:
    return [Binding(None, f"{n} (given by the operator)") for n in names]


def _mask_fn(block_mask: Any) -> Any:
    items = _items(block_mask)
    return items[-1] if items else None


#: operator -> (role, subgraph argument, bindings of its inputs) for each subgraph it runs
_ROLES: dict[str, Callable[[tuple, dict], list[tuple[str, Any, list[Binding]]]]] = {
    # cond(pred, true_fn, false_fn, operands)
    "cond": lambda a, k: [("true branch", a[1], _operands(a[3])), ("false branch", a[2], _operands(a[3]))],
    # while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)
    "while_loop": lambda a, k: [("condition", a[0], _operands(a[2]) + _operands(a[3])),
                                ("body", a[1], _operands(a[2]) + _operands(a[3]))],
    # map_impl(f, xs, pos_args): the body sees one slice of each mapped input
    "map_impl": lambda a, k: [("body (per slice)", a[0], _operands(a[1], "a slice of ") + _operands(a[2]))],
    # flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options, score_mod_buffers, mask_mod_buffers)
    "flex_attention": lambda a, k: [
        ("score_mod", a[3], _given("score", "batch", "head", "q_idx", "kv_idx") + _operands(a[7:8])),
        ("mask_mod", _mask_fn(a[4]), _given("batch", "head", "q_idx", "kv_idx") + _operands(a[8:9]))],
    # invoke_subgraph(subgraph, identifier, *operands)
    "invoke_subgraph": lambda a, k: [("subgraph", a[0], _operands(a[2:]))],
    # tag_activation_checkpoint(fn, *args) / wrap(fn, *args)
    "tag_activation_checkpoint": lambda a, k: [("checkpointed region", a[0], _operands(a[1:]))],
    "wrap": lambda a, k: [("wrapped region", a[0], _operands(a[1:]))],
}


def operator_name(node: NodeRecord) -> str | None:
    """``cond`` for a node calling ``torch.ops.higher_order.cond``; None for any other node."""
    if node.op != "call_function" or not node.target.startswith(HOP_PREFIX):
        return None
    return node.target[len(HOP_PREFIX):]


def subgraph_entries(graph: GraphRecord) -> dict[str, GraphRecord]:
    """The subgraphs a graph holds, by module-state path."""
    return {e.path: e.graph for e in graph.module_state if isinstance(e, SubgraphEntry)}


def hop_calls(graph: GraphRecord) -> dict[str, HopCall]:
    """Every higher-order operator's node of ``graph`` (not of its subgraphs), by node name."""
    entries = subgraph_entries(graph)
    attrs = {n.name: n.target for n in graph.nodes if n.op == "get_attr" and n.target in entries}
    out = {}
    for node in graph.nodes:
        name = operator_name(node)
        if name is None:
            continue
        values = [*node.args, *node.kwargs.values()]
        calls = next((v.name for v in values if isinstance(v, ConstantArg) and v.kind == "operator"), None)
        uses: list[SubgraphUse] = []
        try:
            roles = _ROLES[name](node.args, node.kwargs) if name in _ROLES else []
        except (IndexError, TypeError, KeyError):  # not the signature we know: its subgraphs without roles
            roles = []
        for role, ref, bindings in roles:
            if isinstance(ref, NodeRef) and ref.name in attrs:
                path = attrs[ref.name]
                uses.append(SubgraphUse(role, path, entries[path], tuple(bindings)))
        if not uses:  # an operator we do not know: every subgraph it is passed, named by its path
            refs = dict.fromkeys(r for r in iter_arg_refs([node.args, list(node.kwargs.values())]) if r in attrs)
            uses = [SubgraphUse(attrs[r], attrs[r], entries[attrs[r]], ()) for r in refs]
        if uses or calls:
            out[node.name] = HopCall(node.name, name, calls, tuple(uses))
    return out


def subgraph_attributes(graph: GraphRecord) -> set[str]:
    """Names of the ``get_attr`` nodes that only pass a subgraph to an operator: drawn inside the
    operator's frame, not as nodes of their own."""
    entries = subgraph_entries(graph)
    return {n.name for n in graph.nodes if n.op == "get_attr" and n.target in entries}


def short_operator(name: str) -> str:
    """``torch.ops.rafx.tick.default`` -> ``rafx.tick``."""
    name = name.removeprefix("torch.ops.")
    return name.removesuffix(".default")


def ops_in(graph: GraphRecord) -> int:
    """Compute nodes of a graph and of every subgraph it holds."""
    return graph.op_count() + sum(ops_in(g) for g in subgraph_entries(graph).values())


def nodes_in(graph: GraphRecord) -> int:
    """Nodes of a graph and of every subgraph it holds."""
    return len(graph.nodes) + sum(nodes_in(g) for g in subgraph_entries(graph).values())

"""Cutting inside higher-order operators: inline a subgraph in place of the operator that runs it.

A failure inside ``torch.cond``'s branch used to minify to the whole ``cond`` with both
branches: the node passes see one node with two subgraph arguments, and removing the node
removes the failing op with it. The smallest failing graph is usually the one op inside. So
before the node passes run, each higher-order operator is offered inlined -- ``cond`` as one
branch, ``while_loop`` as one application of its body, ``map`` as its body on the first slice,
``invoke_subgraph``, activation checkpointing and ``wrap`` as their subgraph -- and a variant
that still fails replaces the graph; the node passes then cut inside what was a subgraph. An
inlined ``cond``/``while_loop``/``map`` computes something else than the operator did; that is
fine for a minifier, whose only question is whether the failure stays, and the oracle asks it.
Which argument holds which subgraph is PyTorch's choice and changes between versions: each
layout read here is listed (``_LAYOUTS``), checked against the node before it is read, and a node
that does not match is left whole with a warning that says why.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from reproarchive.compat.dispatch import HigherOrderOperator

log = logging.getLogger("reproarchive.minify")


@dataclass(frozen=True)
class _Layout:
    """How a higher-order operator lays out its arguments, as this module reads them: ``arity``
    positional arguments (at least that many, with ``variadic``), a subgraph (a ``get_attr`` of a
    GraphModule) at exactly the ``subgraphs`` positions, a tuple or list at the ``sequences``
    positions; ``split`` reads (what, subgraph, operands, outputs) from them (None: written out
    by a rewriting of its own). PyTorch changes these layouts between versions; a node that does
    not match is left whole, and said so (``layout_problem``), never read wrongly or silently
    skipped. ``tests/minifier/test_hop_layouts.py`` checks every one against this torch's graphs."""

    arity: int
    subgraphs: tuple[int, ...]
    sequences: tuple[int, ...] = ()
    variadic: bool = False
    split: Callable[[tuple], list[tuple[str, Any, list, str]]] | None = None


#: higher-order operator -> its argument layout
_LAYOUTS: dict[str, _Layout] = {
    # cond(pred, true_fn, false_fn, operands)
    "cond": _Layout(4, (1, 2), (3,), split=lambda a: [("true branch", a[1], list(a[3]), "same"),
                                                      ("false branch", a[2], list(a[3]), "same")]),
    # while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)
    "while_loop": _Layout(4, (0, 1), (2, 3), split=lambda a: [("body once", a[1], [*a[2], *a[3]], "same")]),
    # map_impl(f, xs, pos_args): the body on the first slice, its results given the mapped dimension back
    "map_impl": _Layout(3, (0,), (1, 2), split=lambda a: [
        ("body on the first slice", a[0], [("first", x) for x in a[1]] + list(a[2]), "stack")]),
    # invoke_subgraph(subgraph, identifier, *operands)
    "invoke_subgraph": _Layout(2, (0,), variadic=True, split=lambda a: [("subgraph", a[0], list(a[2:]), "same")]),
    # tag_activation_checkpoint(fn, *args) / wrap(fn, *args)
    "tag_activation_checkpoint": _Layout(1, (0,), variadic=True,
                                         split=lambda a: [("checkpointed region", a[0], list(a[1:]), "same")]),
    "wrap": _Layout(1, (0,), variadic=True, split=lambda a: [("wrapped region", a[0], list(a[1:]), "same")]),
    # flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers,
    # mask_mod_other_buffers): written out densely by ``_flex_dense``
    "flex_attention": _Layout(9, (3,), (4, 7, 8)),
}


def _is_subgraph(gm: fx.GraphModule, arg: Any) -> bool:
    return isinstance(arg, fx.Node) and arg.op == "get_attr" and isinstance(_attr(gm, arg.target), fx.GraphModule)


def layout_problem(gm: fx.GraphModule, node: fx.Node) -> str | None:
    """Why higher-order operator ``node`` of ``gm`` does not have the layout ``_LAYOUTS`` lists
    for it (None: it has it). An operator not listed has no layout to check."""
    layout = _LAYOUTS.get(node.target.name())
    if layout is None:
        return None
    args = node.args
    if len(args) != layout.arity and not (layout.variadic and len(args) >= layout.arity):
        want = f"at least {layout.arity}" if layout.variadic else f"{layout.arity}"
        return f"it has {len(args)} arguments, where {want} were expected"
    found = tuple(i for i, a in enumerate(args) if _is_subgraph(gm, a))
    if found != layout.subgraphs:
        return f"its subgraphs are arguments {list(found)}, where {list(layout.subgraphs)} were expected"
    odd = [i for i in layout.sequences if not isinstance(args[i], (tuple, list))]
    if odd:
        return f"its arguments {odd} are not sequences of operands"
    return None


def inline_variants(gm: fx.GraphModule, skipped: dict[str, str] | None = None
                    ) -> Iterator[tuple[str, fx.GraphModule]]:
    """Every way of inlining one higher-order operator of ``gm``: (what was inlined, new graph).
    A listed operator whose node does not have its listed layout is not inlined; ``skipped``
    (node name -> why) collects those. Each new graph remembers how it was made from ``gm``
    (``inlining_steps``)."""
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, HigherOrderOperator):
            continue
        name = node.target.name()
        if name not in _LAYOUTS:
            continue
        problem = layout_problem(gm, node)
        if problem is not None:
            if skipped is not None:
                skipped[node.name] = f"{name} ({problem})"
            continue
        for k, (what, make) in enumerate(_ways(gm, node)):
            variant = make()
            if variant is not None:
                _MADE_FROM[variant] = (gm, (node.name, k))
                yield f"{node.name}: {what}", variant


def _ways(gm: fx.GraphModule, node: fx.Node) -> list[tuple[str, Callable[[], fx.GraphModule | None]]]:
    """The ways of inlining operator ``node`` (its layout checked), in a fixed order: (what, make)."""
    name = node.target.name()
    if name == "flex_attention":
        return [("flex_attention written out densely (its score_mod inlined)", lambda: _flex_dense(gm, node))]
    return [(f"{name} {what}", lambda sub=sub, operands=operands, outputs=outputs:
             _inline(gm, node.name, _attr(gm, sub.target), operands, outputs))
            for what, sub, operands, outputs in _LAYOUTS[name].split(node.args)]


#: inlined graph -> (the graph it was made from, its step: (operator node's name, which way))
_MADE_FROM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def inlining_steps(gm: fx.GraphModule) -> list[tuple[str, int]]:
    """How ``inline_variants`` made ``gm`` from a graph it did not make, step by step (empty:
    ``gm`` is not an inlined graph)."""
    steps = []
    while gm in _MADE_FROM:
        gm, step = _MADE_FROM[gm]
        steps.append(step)
    return steps[::-1]


def inlined_alike(gm: fx.GraphModule, steps: list[tuple[str, int]]) -> fx.GraphModule | None:
    """``gm`` inlined by the same ``steps`` (``inlining_steps``) as another graph of the same
    program (another rank's); None where ``gm`` does not have an operator node of that name and
    layout, or that way of inlining it fails."""
    for name, k in steps:
        node = next((n for n in gm.graph.nodes if n.name == name), None)
        if node is None or node.op != "call_function" or not isinstance(node.target, HigherOrderOperator) \
                or node.target.name() not in _LAYOUTS or layout_problem(gm, node) is not None:
            return None
        ways = _ways(gm, node)
        inlined = ways[k][1]() if k < len(ways) else None
        if inlined is None:
            return None
        _MADE_FROM[inlined] = (gm, (name, k))
        gm = inlined
    return gm


def _attr(gm: fx.GraphModule, path: str) -> Any:
    obj: Any = gm
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj


def _flex_dense(gm: fx.GraphModule, node: fx.Node) -> fx.GraphModule | None:
    """``flex_attention(q, k, v, score_mod, block_mask, scale, ...)`` as dense attention with the
    score_mod subgraph applied to the whole score matrix (its index arguments broadcast
    ``arange``s), so that a failing op of the score_mod becomes an ordinary node. The block mask
    is dropped: only the failure has to survive, and the oracle checks that."""
    args = node.args
    body = _attr(gm, args[3].target)  # its layout checked (``layout_problem``)

    def dense(graph: fx.Graph, env: dict, root: torch.nn.Module, prefix: str) -> list | None:
        q, k, v = (env[a] if isinstance(a, fx.Node) else a for a in args[:3])
        scale = args[5]
        scores = graph.call_function(torch.matmul, (q, graph.call_method("transpose", (k, -2, -1))))
        if isinstance(scale, (int, float)):
            scores = graph.call_function(operator.mul, (scores, scale))
        index = []
        for dim, source in ((0, q), (1, q), (2, q), (2, k)):
            n = graph.call_method("size", (source, dim))
            shape = [1, 1, 1, 1]
            shape[dim if source is q else 3] = -1
            index.append(graph.call_method("view", (graph.call_function(torch.arange, (n,), {"device": None}), *shape)))
        extra = [env[a] if isinstance(a, fx.Node) else a for a in (args[7] or ())]
        outs = _copy_body(graph, root, body, [scores, *index, *extra], prefix=prefix)
        if outs is None or len(outs) != 1:
            return None
        weights = graph.call_function(torch.softmax, (outs[0], -1))
        return [graph.call_function(torch.matmul, (weights, v))]

    return _rewrite(gm, node, dense, getitems={0})


def _inline(gm: fx.GraphModule, name: str, body: fx.GraphModule, operands: list, outputs: str) -> fx.GraphModule | None:
    """``gm`` with node ``name`` replaced by ``body``'s nodes; None when the operator's result
    is used other than through ``getitem`` (the only use this rewriting understands)."""
    hop = next(n for n in gm.graph.nodes if n.name == name)

    def inlined(graph: fx.Graph, env: dict, root: torch.nn.Module, prefix: str) -> list | None:
        outs = _copy_body(graph, root, body, [_operand(graph, env, o) for o in operands], prefix=prefix)
        if outs is not None and outputs == "stack":
            outs = [graph.call_method("unsqueeze", (o, 0)) if isinstance(o, fx.Node) else o for o in outs]
        return outs

    return _rewrite(gm, hop, inlined)


def _rewrite(gm: fx.GraphModule, hop: fx.Node, replace, getitems: set[int] | None = None) -> fx.GraphModule | None:
    """A copy of ``gm`` in which ``replace(graph, env, root, prefix)`` builds the nodes standing
    for ``hop``'s results; None when a result is used other than through ``getitem`` (of an
    index in ``getitems``, when given), or the rewritten graph is not valid."""
    root = torch.nn.Module()
    for key, value in gm.named_children():
        root.add_module(key, value)
    for key, value in [*gm.named_parameters(recurse=False), *gm.named_buffers(recurse=False)]:
        setattr(root, key, value)
    for key, value in vars(gm).items():
        if isinstance(value, torch.Tensor) and not hasattr(root, key):
            setattr(root, key, value)
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    outs: list | None = None
    for node in gm.graph.nodes:
        if node is hop:
            outs = replace(graph, env, root, f"{hop.name}_")
            if outs is None:
                return None
            continue
        if outs is not None and node.op == "call_function" and node.target is operator.getitem \
                and node.args[0] is hop:
            index = node.args[1]
            if not isinstance(index, int) or not -len(outs) <= index < len(outs) \
                    or getitems is not None and index not in getitems:
                return None
            env[node] = outs[index]
            continue
        if hop in node.all_input_nodes:
            return None
        env[node] = graph.node_copy(node, lambda n: env[n])
    try:
        out = fx.GraphModule(root, graph)  # no dead-code pass: it drops vmap-nesting calls; the minifier prunes
        out.graph.lint()
        out.recompile()
    except Exception:  # a rewrite this graph does not allow: not a variant
        return None
    return out


def _operand(graph: fx.Graph, env: dict[fx.Node, fx.Node], operand: Any) -> Any:
    if isinstance(operand, tuple) and len(operand) == 2 and operand[0] == "first":
        return graph.call_function(operator.getitem, (env[operand[1]], 0))
    return env[operand] if isinstance(operand, fx.Node) else operand


def _copy_body(graph: fx.Graph, root: torch.nn.Module, body: fx.GraphModule, operands: list,
               prefix: str) -> list[fx.Node] | None:
    """Copy ``body``'s nodes into ``graph`` (its placeholders bound to ``operands``, its own
    attributes moved onto ``root`` under ``prefix``) and return its outputs."""
    inner: dict[fx.Node, Any] = {}
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        return None
    for ph, value in zip(placeholders, operands):
        inner[ph] = value
    outs = None
    for n in body.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            result = n.args[0]
            outs = list(result) if isinstance(result, (tuple, list)) else [result]
            outs = [inner[o] if isinstance(o, fx.Node) else o for o in outs]
            break
        if n.op == "get_attr":
            new_name = prefix + n.target.replace(".", "_")
            setattr(root, new_name, _attr(body, n.target))
            inner[n] = graph.get_attr(new_name)
            continue
        inner[n] = graph.node_copy(n, lambda m: inner[m])
    return outs


def inline_while_failing(gm: fx.GraphModule, fails: Callable[[fx.GraphModule], bool],
                         limit: int = 64) -> fx.GraphModule:
    """Inline higher-order operators one at a time, keeping each inlining that still fails,
    until none is left that does (at most ``limit`` judgements)."""
    tried = 0
    progress = True
    skipped: dict[str, str] = {}
    while progress and tried < limit:
        progress = False
        for _what, variant in inline_variants(gm, skipped):
            tried += 1
            if fails(variant):
                gm, progress = variant, True
                break
            if tried >= limit:
                break
    for node, why in skipped.items():
        log.warning("reproarchive.minify cannot cut inside %s: this torch's %s does not have the layout "
                    "reproarchive.minifier.subgraphs reads; it is cut around, whole", node, why)
    return gm

"""The fake values Dynamo gives the nodes of the graphs it hands a backend, made again for a
replay's graph and for the subgraphs its higher-order operators run.

A backend (or a pass it runs) may read each node's ``example_value``: Dynamo's graph carries one
on every node, a ``cond`` branch's and a ``while_loop`` body's included. A replay's graph is
rebuilt from the archive's code and carries none, so it gets them here.

This module is bundled whole into the scripts ``export`` writes (``standalone.shared_blocks``), so the
replay and the exported script give a backend the same graph from one text: it imports the
standard library and torch only (``tests/standalone/test_bundled_code.py`` keeps it so).

How an operator's fake kernel runs its subgraphs is PyTorch's choice: checked with 2.11.0,
2.13.0 and 2.15.0, where ``cond`` runs both branches, ``map_impl`` and ``scan`` their bodies,
``while_loop`` its body once but never its condition, activation checkpointing its body through
an FX interpreter, and torch's fake propagation runs ``invoke_subgraph``'s itself. A subgraph
whose inputs the operator makes itself (``flex_attention``'s ``score_mod``: a score and four
indices) gets them as Dynamo makes them.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    'node.meta["example_value"]',
    'node.meta["val"]',
    "torch._ops.HigherOrderOperator",
)


def propagate_example_values(gm: Any, fake_mode: Any, fakes: list[Any]) -> None:
    """Give every node of ``gm`` and of the subgraphs its higher-order operators run (``cond``'s
    branches, ``while_loop``'s condition and body ...) the ``example_value`` Dynamo gives the
    nodes of the graphs it hands a backend: the fake value each computes from the placeholders'
    ``fakes`` in ``fake_mode`` (symbols, unbacked ones of ``nonzero()`` included). A subgraph's
    values are those of the fake run the operator itself makes of it (``_run_as_called``), so
    they share the outer graph's symbols, as Dynamo's do; a subgraph no operator ran keeps
    none. ``val`` is left as it was: Dynamo's graph has none; AOTAutograd's tracing writes it.
    Raises what the fake run raises, with no ``example_value`` written past the placeholders'."""
    graphs = [m for m in gm.modules() if hasattr(m, "graph")]
    before = {n: n.meta.get("val", _NONE) for g in graphs for n in g.graph.nodes}
    ran = [gm]
    try:
        with _run_as_called(graphs, fake_mode, ran, before):
            _propagation(gm, fake_mode).propagate_dont_convert_inputs(*fakes)
        for owner, node in ((g, n) for g in ran for n in g.graph.nodes if n.op != "output"):
            if _subgraph(owner, node) is not None:  # Dynamo gives a subgraph's ``get_attr`` none
                continue
            if owner is gm and node.op == "placeholder" and "example_value" in node.meta:
                continue  # the caller's own fake input, as Dynamo hands it
            node.meta["example_value"] = _as_dynamo_writes(node)
    finally:  # also where the fake run failed part way: no value of it is left under ``val``
        for node, value in before.items():
            if value is _NONE:
                node.meta.pop("val", None)
            else:
                node.meta["val"] = value


def _as_dynamo_writes(node: Any) -> Any:
    """The value the fake run wrote for ``node``, as Dynamo writes it: None for a node that made
    none (an assert); for ``x.size()`` ``x``'s ``torch.Size`` (``FakeTensorProp`` writes a
    tuple), and for ``x.size(d)`` and an item of a size its int, which 2.11's ``FakeTensorProp``
    writes as None where it is a plain int."""
    value = node.meta.get("val", _NONE)
    args = node.args
    unwritten = value is None or value is _NONE
    if node.op == "call_method" and node.target == "size" and (isinstance(value, tuple) or unwritten):
        shape = getattr(_value(args[0]), "shape", None)
        if shape is not None and len(args) == 1:
            return shape
        if shape is not None and len(args) == 2 and isinstance(args[1], int) and -len(shape) <= args[1] < len(shape):
            return shape[args[1]]
    if node.op == "call_function" and node.target is operator.getitem and unwritten \
            and len(args) == 2 and isinstance(args[1], int):
        whole = _as_dynamo_writes(args[0]) if hasattr(args[0], "meta") else None
        if isinstance(whole, tuple) and -len(whole) <= args[1] < len(whole):
            return whole[args[1]]
    return None if value is _NONE else value


def _value(arg: Any) -> Any:
    """What an operator's argument is in the fake run: a node's ``val`` (``_NONE`` where the run
    wrote none), any other argument itself."""
    return arg.meta.get("val", _NONE) if hasattr(arg, "meta") else arg


def _propagation(gm: Any, fake_mode: Any) -> Any:
    return _propagation_class()(gm, mode=fake_mode)


@functools.cache
def _propagation_class() -> Any:
    """torch's ``FakeTensorProp``, where an ``invoke_subgraph`` node, whose value
    ``FakeTensorProp`` returns without writing it, gets it written."""
    import torch
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    class Propagation(FakeTensorProp):
        def run_node(self, n: Any) -> Any:
            before = n.meta.get("val", _NONE)
            result = super().run_node(n)
            if n.meta.get("val", _NONE) is before and isinstance(result, (tuple, list)) \
                    and all(isinstance(v, (torch.Tensor, torch.SymInt, int, float, bool)) for v in result):
                n.meta["val"] = tuple(result)
            return result

    return Propagation


#: higher-order operator -> (the argument holding a subgraph its fake kernel does not call as a
#: module, where that subgraph's inputs are): ``while_loop``'s kernel runs the body once and never
#: the condition, which takes the body's inputs (``("sibling", 1)``); activation checkpointing
#: runs its body through an FX interpreter, on the operator's arguments after it (``("after", 0)``);
#: an ``invoke_subgraph`` body torch's fake propagation skips (2.11 makes two bodies for a region
#: called twice and ran only the first) takes the arguments after the identifier (``("after", 1)``);
#: ``flex_attention``'s ``score_mod`` and ``mask_mod`` take scalars the operator makes (``_flex_inputs``)
_NOT_CALLED = {"while_loop": (0, ("sibling", 1)), "while_loop_stack_output": (0, ("sibling", 1)),
               "tag_activation_checkpoint": (0, ("after", 0)), "invoke_subgraph": (0, ("after", 1)),
               "flex_attention": (3, ("given", 0))}


@contextlib.contextmanager
def _run_as_called(graphs: list[Any], fake_mode: Any, ran: list[Any], before: dict[Any, Any]) -> Any:
    """While inside, each subgraph of ``graphs`` (all but the first, the top graph) runs as a
    fake propagation that writes ``val`` on its nodes when an operator's fake kernel calls it,
    and is added to ``ran``. On leaving, a subgraph torch's fake propagation ran itself (its
    nodes' ``val`` differ from ``before``) is added to ``ran``, and one nothing ran
    (``_NOT_CALLED``) is propagated on the inputs it would have had."""
    subgraphs = graphs[1:]
    called: dict[int, tuple] = {}

    def runner(module: Any) -> Any:
        def forward(*args: Any) -> Any:
            called[id(module)] = args
            if module not in ran:
                ran.append(module)
            return _propagation(module, fake_mode).propagate_dont_convert_inputs(*args)
        return forward

    for module in subgraphs:
        module.forward = runner(module)
    try:
        yield
        ran += [g for g in subgraphs if g not in ran and any(n.meta.get("val", _NONE) is not before[n]
                                                             for n in g.graph.nodes)]
        for _ in subgraphs:  # a pass runs the subgraphs nested in what the last one ran
            pending = [(sub, args) for sub, args in _not_called(graphs, ran, called) if sub not in ran]
            if not pending:
                break
            for sub, args in pending:
                sub.forward(*args)
    finally:
        for module in subgraphs:
            vars(module).pop("forward", None)


def _not_called(graphs: list[Any], ran: list[Any], called: dict[int, tuple]) -> list[tuple[Any, list]]:
    """(subgraph, its inputs) for each subgraph of an operator node of a graph in ``ran`` listed
    in ``_NOT_CALLED`` whose inputs are known: its sibling was called, or its operands have
    their fake values."""
    from torch._ops import HigherOrderOperator

    found = []
    for owner in (g for g in graphs if g in ran):
        for node in owner.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, HigherOrderOperator) \
                    or node.target.name() not in _NOT_CALLED:
                continue
            at, (kind, where) = _NOT_CALLED[node.target.name()]
            if kind == "given":  # the operator makes their inputs itself
                found += _flex_inputs(owner, node)
                continue
            sub = _subgraph(owner, node.args[at]) if at < len(node.args) else None
            if sub is None:
                continue
            if kind == "sibling":
                sibling = _subgraph(owner, node.args[where]) if where < len(node.args) else None
                if sibling is not None and id(sibling) in called:
                    found.append((sub, list(called[id(sibling)])))
            else:
                operands = [_value(a) for a in node.args[at + 1 + where:]]
                if all(v is not _NONE for v in operands):
                    found.append((sub, operands))
    return found


def _flex_inputs(owner: Any, node: Any) -> list[tuple[Any, list]]:
    """``flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options, score_mod_buffers,
    mask_mod_buffers)``'s two subgraphs and their inputs as Dynamo traces them: ``score_mod`` a
    score of the query's dtype and four int32 indices (batch, head, query, key), then its
    buffers; ``mask_mod`` (the block mask's last item) the four indices, then its buffers."""
    import torch

    args = node.args
    query = _value(args[0]) if args else None
    if len(args) < 9 or not isinstance(query, torch.Tensor):
        return []
    index = [query.new_zeros((), dtype=torch.int32) for _ in range(4)]
    mask_mod = args[4][-1] if isinstance(args[4], (tuple, list)) and args[4] else None
    found = []
    for at, first, buffers in ((args[3], [query.new_zeros(()), *index], args[7]), (mask_mod, index, args[8])):
        sub = _subgraph(owner, at)
        inputs = [*first, *(_value(a) for a in (buffers or ()))]
        if sub is not None and all(v is not _NONE for v in inputs):
            found.append((sub, inputs))
    return found


def _subgraph(owner: Any, arg: Any) -> Any:
    """The graph module a ``get_attr`` argument of ``owner``'s graph names, or None."""
    if getattr(arg, "op", None) != "get_attr":
        return None
    found = owner
    for part in str(arg.target).split("."):
        found = getattr(found, part, None)
    return found if hasattr(found, "graph") else None


_NONE = object()

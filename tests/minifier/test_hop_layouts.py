"""The minifier reads each higher-order operator's arguments by a layout it lists
(``reproarchive.minifier.subgraphs._LAYOUTS``): which position holds which subgraph and which
the operands. PyTorch changes these layouts between versions; a listed layout that no longer
matches must fail here, on a torch upgrade, and a node that does not match must be left whole
and said so, never read wrongly or skipped in silence."""

from __future__ import annotations

import logging

import pytest
import torch

from reproarchive.minifier import subgraphs
from support import hop_programs


@pytest.fixture(scope="module")
def graphs():
    return [(name, level, hop_programs.graph_of(fn, level)) for name, fn, level in hop_programs.PROGRAMS]


def _hops(gm):
    return [n for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)]


def test_every_listed_layout_is_this_torchs(graphs):
    seen, inlined = set(), set()
    for name, level, gm in graphs:
        for node in _hops(gm):
            if node.target.name() in subgraphs._LAYOUTS:  # others (with_effects...) are not cut inside
                assert subgraphs.layout_problem(gm, node) is None, (level, name, node.format_node())
                seen.add(node.target.name())
        skipped: dict[str, str] = {}
        inlined.update(what.split(": ")[1].split()[0] for what, _ in subgraphs.inline_variants(gm, skipped))
        assert skipped == {}, (level, name)
    assert seen == set(subgraphs._LAYOUTS), "a listed operator none of hop_programs' graphs has"
    assert inlined == set(subgraphs._LAYOUTS), "a listed operator whose layout gave no inlining"


def _cond_graph(graphs):
    gm = next(gm for name, level, gm in graphs if (name, level) == ("cond", "dynamo"))
    return gm, next(n for n in _hops(gm) if n.target.name() == "cond")


@pytest.mark.parametrize("change,reason", [
    (lambda a: (*a, a[3]), "it has 5 arguments, where 4 were expected"),
    (lambda a: (a[0], a[2], a[3], a[1]), "its subgraphs are arguments [1, 3], where [1, 2] were expected"),
    (lambda a: (a[0], a[1], a[2], a[3][0]), "its arguments [3] are not sequences of operands"),
])
def test_a_node_of_another_layout_is_left_whole_and_said_so(graphs, change, reason, caplog):
    gm, cond = _cond_graph(graphs)
    before = cond.args
    cond.args = change(before)
    try:
        skipped: dict[str, str] = {}
        assert list(subgraphs.inline_variants(gm, skipped)) == []
        assert skipped == {cond.name: f"cond ({reason})"}
        with caplog.at_level(logging.WARNING, logger="reproarchive.minify"):
            assert subgraphs.inline_while_failing(gm, lambda variant: True) is gm
        assert [r.getMessage() for r in caplog.records] == [
            f"reproarchive.minify cannot cut inside {cond.name}: this torch's cond ({reason}) does not have the "
            "layout reproarchive.minifier.subgraphs reads; it is cut around, whole"]
    finally:
        cond.args = before


def test_another_rank_s_graph_is_inlined_the_way_one_rank_s_was(graphs):
    """A job's minify inlines an operator on the failing rank; every other rank's graph (the same
    program, its own copy) is inlined the same way (``inlined_alike``), step by step, nested too."""
    import copy

    for name, level, gm in graphs:
        for _, once in subgraphs.inline_variants(gm):
            nested = next(subgraphs.inline_variants(once), (None, None))[1]  # a second operator, if any
            for inlined in (once, nested) if nested is not None else (once,):
                steps = subgraphs.inlining_steps(inlined)
                assert steps and steps[0][0] in {n.name for n in _hops(gm)}, (level, name, steps)
                alike = subgraphs.inlined_alike(copy.deepcopy(gm), steps)
                assert alike is not None and alike.code == inlined.code, (level, name, steps)
    gm, cond = _cond_graph(graphs)
    assert subgraphs.inlined_alike(gm, [("no_such_node", 0)]) is None
    assert subgraphs.inlined_alike(gm, [(cond.name, 7)]) is None

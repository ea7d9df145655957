"""A compile failure planted on any real graph, so that every graph of the model corpus can be
minified: ``fail_on_target`` is a ``module:function`` compiler that raises when the graph it is
given calls one chosen target, and compiles (runs eagerly) otherwise.

The target is chosen per graph from the graph itself (``choose_target``), so the failure does not
depend on the model having some particular op, and is passed in ``FAIL_ON_ENV`` rather than in
the backend's name: the replay resolves the recorded ``module:function`` as it would any user's
compiler, and a worker process started for an isolated replay inherits the variable.
"""

from __future__ import annotations

import os
from collections import Counter

from torch import fx

import reproarchive
from reproarchive.context import failure as failure_mod

FAIL_ON_ENV = "REPROARCHIVE_TEST_FAIL_ON"
COMPUTE_OPS = ("call_function", "call_method", "call_module")


class PlantedCompileError(RuntimeError):
    """What ``fail_on_target`` raises: a compile error of the (pretend) compiler."""


def target_key(node: fx.Node) -> str:
    """``op:qualified target``, stable across processes (no object addresses)."""
    target = node.target
    if not isinstance(target, str):
        try:
            target = fx.node._get_qualified_name(target)
        except (RuntimeError, AttributeError):  # a callable without an importable name
            target = getattr(target, "__name__", repr(target))
    return f"{node.op}:{target}"


def compute_keys(gm: fx.GraphModule) -> list[str]:
    return [target_key(n) for n in gm.graph.nodes if n.op in COMPUTE_OPS]


def choose_target(gm: fx.GraphModule) -> str:
    """The first compute node's target that occurs once in the graph, else the last one's: a
    target the graph has, whatever the model (a graph without compute ops has none to plant)."""
    keys = compute_keys(gm)
    if not keys:
        raise ValueError("the graph calls nothing: there is no target to plant a failure on")
    counts = Counter(keys)
    return next((k for k in keys if counts[k] == 1), keys[-1])


def fail_on_target(gm: fx.GraphModule, example_inputs):
    """Raise ``PlantedCompileError`` when ``gm`` calls the target named in ``FAIL_ON_ENV``."""
    planted = os.environ.get(FAIL_ON_ENV)
    if not planted:
        raise RuntimeError(f"{FAIL_ON_ENV} names no target to fail on")
    if planted in compute_keys(gm):
        raise PlantedCompileError(f"planted compile error: the graph calls {planted}")
    return gm.forward


BACKEND = f"{__name__}:{fail_on_target.__qualname__}"


def pack_planted(gm: fx.GraphModule, inputs: list, path, monkeypatch) -> str:
    """Choose ``gm``'s target, set ``FAIL_ON_ENV`` to it (through ``monkeypatch``), compile ``gm``
    with ``fail_on_target`` to record the real exception it raises, and pack the graph with that
    failure at ``path``. Returns the planted target."""
    planted = choose_target(gm)
    monkeypatch.setenv(FAIL_ON_ENV, planted)
    try:
        fail_on_target(gm, inputs)
    except PlantedCompileError as exc:
        failure = failure_mod.record_from_exception(exc, "compile", backend=BACKEND)
    else:
        raise AssertionError(f"fail_on_target compiled a graph that calls {planted}")
    reproarchive.pack(gm, inputs, path, backend=BACKEND, failure=failure)
    return planted

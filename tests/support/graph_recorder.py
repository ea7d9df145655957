"""A custom compiler function that writes down, as JSON, the graph it is handed.

An exported ``repro.py`` runs in a child Python that has torch and nothing else, so what the
backend received can only come back as a file. The same ``describe`` reads the archive's graph
in the test, so "the script hands the backend the recorded graph" becomes an equality of two
JSON documents. This module imports only torch and the standard library: the child must not
need reproarchive, and ``record`` checks that it was never imported.
"""

from __future__ import annotations

import json
import math
import os
import sys

import torch
import torch.fx as fx
from torch.fx.node import _get_qualified_name

OUT_VARIABLE = "GRAPH_RECORDER_OUT"


def record(gm, example_inputs):
    """Write ``describe(gm)`` to the file named by $GRAPH_RECORDER_OUT; run the graph eagerly."""
    if "reproarchive" in sys.modules and sys.modules["reproarchive"] is not None:
        raise AssertionError("the exported script imported reproarchive")
    with open(os.environ[OUT_VARIABLE], "w", encoding="utf-8") as f:
        json.dump(describe(gm), f, indent=1)
    return gm.forward


def describe(gm) -> dict:
    """Every graph of ``gm`` (the root as "", subgraphs by dotted path): each node's op, name,
    target and arguments, constants tagged with their type (2 and 2.0 differ), and the state."""
    out = {}
    for path, module in gm.named_modules():
        if isinstance(module, fx.GraphModule):
            out[path] = {
                "nodes": [_node(n) for n in module.graph.nodes],
                "code": module.code,
            }
    out["state"] = {name: [str(t.dtype), list(t.shape), t.tolist(), isinstance(t, torch.nn.Parameter)]
                    for name, t in list(gm.named_parameters()) + list(gm.named_buffers())}
    return out


def _node(node) -> list:
    target = node.target if isinstance(node.target, str) else _get_qualified_name(node.target)
    return [node.op, node.name, target, _value(node.args), _value(node.kwargs)]


def _value(v):
    if isinstance(v, fx.Node):
        return ["node", v.name]
    if isinstance(v, bool) or v is None:
        return [type(v).__name__, v]
    if isinstance(v, int):
        return ["int", v]
    if isinstance(v, float):
        return ["float", repr(v) if not math.isfinite(v) or v == 0 else v.hex()]
    if isinstance(v, str):
        return ["str", v]
    if isinstance(v, (list, tuple)):
        return [type(v).__name__, [_value(x) for x in v]]
    if isinstance(v, dict):
        return ["dict", [[_value(k), _value(x)] for k, x in v.items()]]
    if isinstance(v, slice):
        return ["slice", [_value(v.start), _value(v.stop), _value(v.step)]]
    if isinstance(v, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return [type(v).__name__, str(v)]
    return [type(v).__name__, repr(v)]

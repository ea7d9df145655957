"""A backend that writes down the node meta Dynamo hands it (its subgraphs' too: each node's
``example_value`` and ``stack_trace``), then fails: what a replay must hand
it again (``tests/replay/test_backend_meta.py``). ``module:function`` name: ``BACKEND``."""

from __future__ import annotations

import json
import os

import torch

BACKEND = f"{__name__}:record_and_fail"
OUT_VARIABLE = "REPROARCHIVE_TEST_META_OUT"
SEEN: list[list[tuple]] = []


def _described(value) -> tuple:
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(str(s) for s in value.shape), str(value.device))
    if isinstance(value, torch.SymInt):
        return ("symint", str(value))
    return (type(value).__name__,)


def record_and_fail(gm: torch.fx.GraphModule, example_inputs):
    SEEN.append([(where, n.op, n.name, _described(n.meta.get("example_value")) if "example_value" in n.meta else None,
                  n.meta.get("stack_trace"))
                 for where, module in gm.named_modules() if isinstance(module, torch.fx.GraphModule)
                 for n in module.graph.nodes if n.op != "output"])
    if os.environ.get(OUT_VARIABLE):  # a replay in another process (an exported script) writes it down
        with open(os.environ[OUT_VARIABLE], "w", encoding="utf-8") as f:
            json.dump(SEEN[-1], f)
    raise RuntimeError("planted failure after reading the graph's meta")

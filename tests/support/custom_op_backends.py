"""A compiler function that fails on custom ops: the custom op is the culprit (``--backend``)."""

from __future__ import annotations

import torch


class CustomOpUnsupported(RuntimeError):
    pass


def fails_on_custom_op(gm, example_inputs):
    for node in gm.graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            name = getattr(target, "_qualified_op_name", None) or target.name()
            if not name.startswith(("aten::", "prims::")):
                raise CustomOpUnsupported(f"this backend cannot compile custom op {name}")
    return gm.forward

"""Compiler bugs planted the way PyTorch's test/dynamo/test_compiler_bisector.py plants them, for
``bisect compiler`` to find: a custom post-grad pass that corrupts one op's operand, reached
through a custom backend (``module:function``, so an isolated replay resolves it as it would a
user's compiler), and inductor's own relu lowering bug (a recorded config value)."""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass


class CorruptAddOperand(CustomGraphPass):
    """Post-grad: the one ``aten.add`` with a constant operand adds 2 instead."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor):
            if not isinstance(node.args[1], torch.fx.Node):
                node.args = (node.args[0], 2)

    def uuid(self):
        return "reproarchive-tests-corrupt-add-operand"


def post_grad_bug(gm, example_inputs):
    """Inductor with ``CorruptAddOperand`` as its custom post-grad pass."""
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    with config.patch(post_grad_custom_post_pass=CorruptAddOperand()):
        return compile_fx(gm, example_inputs)


POST_GRAD_BACKEND = f"{__name__}:{post_grad_bug.__name__}"


def scaled_sin(x):
    """A tiny graph with one add of a constant: mul, add, sin."""
    return (x * 3 + 1).sin()


def negated_relu(x):
    """PyTorch's bad-lowering graph: ``((x * -1) - 0.01).relu()``."""
    return ((x * -1) - 0.01).relu()

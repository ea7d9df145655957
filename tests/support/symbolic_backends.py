"""Backends that fail only on symbolic graphs: the failures a static replay would hide.

Both are AOTAutograd backends whose forward compiler (the graph after decomposition, where
post-grad passes run) inspects the fake values on the nodes: ``fails_on_free_symbols_TESTING``
raises when any node's shape has a free symbol, ``fails_on_unbacked_TESTING`` when one has an
unbacked symbol (``nonzero()``, ``.item()``, ``mark_unbacked``). Registered by name, so that an
archive records a name that replay can look up. ``symbolic_relu_backend`` reads the fake values
of AOTAutograd's graph (a cond's branches included) and fails on a relu whose input's size is
symbolic, so its smallest failing graph is the relu alone only where a value cut from inside the
graph keeps its symbol.
"""

from __future__ import annotations

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
from torch.fx.experimental.symbolic_shapes import free_symbols, free_unbacked_symbols

FREE_SYMBOLS = "fails_on_free_symbols_TESTING"
UNBACKED = "fails_on_unbacked_TESTING"


def _symbols(gm: torch.fx.GraphModule, which) -> list[str]:
    found = set()
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, (torch.Tensor, torch.SymInt)):
            found |= which(value)
    return sorted(map(str, found))


def _free_symbols_pass(gm, example_inputs):
    found = _symbols(gm, free_symbols)
    if found:
        raise RuntimeError(f"symbolic graph: free symbols {', '.join(found)}")
    return gm


def _unbacked_pass(gm, example_inputs):
    found = _symbols(gm, free_unbacked_symbols)
    if found:
        raise RuntimeError(f"graph with unbacked symbols: {', '.join(found)}")
    return gm


#: the same backends as ``module:function`` names (``run --backend support.symbolic_backends:free_symbols_backend``)
_FREE_SYMBOLS = aot_autograd(fw_compiler=_free_symbols_pass)
_UNBACKED = aot_autograd(fw_compiler=_unbacked_pass)


def free_symbols_backend(gm, example_inputs):
    return _FREE_SYMBOLS(gm, example_inputs)


def unbacked_backend(gm, example_inputs):
    return _UNBACKED(gm, example_inputs)


for _name, _backend in ((FREE_SYMBOLS, _FREE_SYMBOLS), (UNBACKED, _UNBACKED)):
    if _name not in _COMPILER_FNS:
        register_backend(_backend, name=_name)


# Programs the tests compile with them


def two_sums(x, y):
    return (x * 2).sum(0) + y.sum(0)


def nonzero_view(x):
    """``nonzero()`` feeding a view: an unbacked size (with ``capture_dynamic_output_shape_ops``)."""
    return x.nonzero().view(-1) * 2


SYMBOLIC_RELU = f"{__name__}:symbolic_relu_backend"


def _symbolic_relu_pass(gm, example_inputs):
    graphs = [m.graph for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]  # a cond's branches too
    for node in (n for g in graphs for n in g.nodes):
        if node.target is torch.ops.aten.relu.default and isinstance(node.args[0], torch.fx.Node):
            if free_symbols(node.args[0].meta.get("val")):
                raise RuntimeError("a relu of a symbolic size")
    return gm


_SYMBOLIC_RELU = aot_autograd(fw_compiler=_symbolic_relu_pass)


def symbolic_relu_backend(gm, example_inputs):
    return _SYMBOLIC_RELU(gm, example_inputs)

"""Compilers whose result depends on state that is not part of the graph: the generator state
(random ops), autocast and inference mode. Each is registered with Dynamo under ``name(fn)``
(what an archive records and ``run`` looks up) and is a ``module:function`` an exported script
takes with ``--backend``, so a test sees what the archive's records make a replay do.

``run_then_fail`` runs the graph as eager does and then fails, with the checksum of what it
computed in its message, and keeps each output in ``SEEN``: the failing run's output and each
replay's can then be compared bit for bit (in this process, or in a script's stderr).
``sigmoid_one_percent_high`` is ``aot_eager`` with a planted accuracy bug: every sigmoid it
compiles comes out 1% high.
"""

from __future__ import annotations

import torch
from torch import fx

SEEN: list[torch.Tensor] = []
MODULE = __name__


def checksum(t: torch.Tensor) -> str:
    return f"{float(t.double().sum()):.9e}"


def run_then_fail(gm: fx.GraphModule, example_inputs):
    def run(*args):
        out = gm(*args)
        first = out[0] if isinstance(out, (tuple, list)) else out
        SEEN.append(first.detach().clone())
        raise RuntimeError(f"planted failure after the run; output checksum {checksum(first.detach())}")
    return run


def _sigmoid_high(x):
    return torch.sigmoid(x) * 1.01


def sigmoid_one_percent_high(gm: fx.GraphModule, example_inputs):
    from torch._dynamo.backends.registry import lookup_backend

    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (torch.sigmoid, torch.nn.functional.sigmoid):
            node.target = _sigmoid_high
    gm.recompile()
    return lookup_backend("aot_eager")(gm, example_inputs)


def fails_under_cpu_autocast(gm: fx.GraphModule, example_inputs):
    if torch.is_autocast_enabled("cpu"):
        raise RuntimeError(f"compiled under CPU autocast ({torch.get_autocast_dtype('cpu')})")
    return gm.forward


def fails_in_inference_mode(gm: fx.GraphModule, example_inputs):
    def run(*args):
        if torch.is_inference_mode_enabled():
            raise RuntimeError("compiled code run in inference mode")
        return gm.forward(*args)
    return run


def backend(fn) -> str:
    """``fn`` as an exported script's ``--backend`` names it."""
    return f"{MODULE}:{fn.__name__}"


def name(fn) -> str:
    """The name ``fn`` is registered under with Dynamo."""
    return f"state_{fn.__name__}_TESTING"


def _register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    for fn in (run_then_fail, sigmoid_one_percent_high, fails_under_cpu_autocast, fails_in_inference_mode):
        if name(fn) not in _COMPILER_FNS:
            register_backend(fn, name=name(fn))


_register()

"""Programs whose failing op sits inside a higher-order operator's subgraph, and the cheap
compiler that fails on it: ``fail_on_relu`` raises when the graph, or any subgraph it holds,
calls ``relu`` (a ``module:function`` backend ``run`` and ``minify`` resolve like a user's).

Two ops are defined here for the operators that only appear after AOTAutograd:
``rafx::bump`` mutates its argument (``auto_functionalized``) and ``rafx::tick`` is registered
as effectful (``with_effects``).
"""

from __future__ import annotations

import torch
from torch import fx

BACKEND = f"{__name__}:fail_on_relu"


class PlantedCompileError(RuntimeError):
    """What ``fail_on_relu`` raises."""


def relu_calls(gm: fx.GraphModule) -> int:
    return sum(1 for sub in gm.modules() if isinstance(sub, fx.GraphModule) for n in sub.graph.nodes
               if n.op in ("call_function", "call_method") and "relu" in str(n.target))


def fail_on_relu(gm: fx.GraphModule, example_inputs):
    if relu_calls(gm):
        raise PlantedCompileError("planted compile error: the graph calls relu")
    return gm.forward


def capture(fn, level: str, path) -> None:
    """Capture ``fn``'s failure in-process into ``path``: as Dynamo hands the graph to a backend
    (``level`` "dynamo") or after AOTAutograd ("aot")."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    import reproarchive

    torch._dynamo.reset()
    backend = reproarchive.capture(fail_on_relu, path=path)
    if level == "aot":
        backend = aot_autograd(fw_compiler=backend)
    try:
        torch.compile(fn, backend=backend, fullgraph=True)(torch.randn(8, 16))
    except Exception as exc:  # noqa: BLE001 -- Dynamo wraps the backend's error
        if "planted compile error" not in str(exc):
            raise
    else:
        raise AssertionError(f"{fn.__name__} did not fail")
    finally:
        torch._dynamo.reset()


def higher_order_ops(gm: fx.GraphModule) -> list[str]:
    return [n.target.name() for n in gm.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.HigherOrderOperator)]


# -- the custom ops auto_functionalized and with_effects call

_lib = torch.library.Library("rafx", "FRAGMENT")
_lib.define("bump(Tensor(a!) x) -> ()")
_lib.define("tick(Tensor x) -> Tensor")


@torch.library.impl(_lib, "bump", "CompositeExplicitAutograd")
def _bump(x):
    x.add_(1)


@torch.library.register_fake("rafx::bump", lib=_lib)
def _bump_fake(x):
    return None


@torch.library.impl(_lib, "tick", "CompositeExplicitAutograd")
def _tick(x):
    return x + 1


@torch.library.register_fake("rafx::tick", lib=_lib)
def _tick_fake(x):
    return torch.empty_like(x)


torch.library._register_effectful_op("rafx::tick", torch._library.effects.EffectType.ORDERED)


# -- programs: (name, function, level) -- "dynamo": the graph Dynamo hands a backend; "aot": after AOTAutograd


def _cond(x):
    from torch._higher_order_ops.cond import cond

    return cond(x.sum() > 0, lambda t: torch.relu(t) * 2, lambda t: t - 1, (x,))


def _while(x):
    from torch._higher_order_ops.while_loop import while_loop

    return while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t.relu() + 1), (torch.tensor(0), x))[1]


def _map(x):
    from torch._higher_order_ops.map import map as hop_map

    return hop_map(lambda t: t.relu() + 1, x)


def _checkpoint(x):
    from torch.utils.checkpoint import checkpoint

    return checkpoint(lambda t: torch.relu(t) * 2, x, use_reentrant=False) + 1


@torch.compiler.nested_compile_region
def _block(t):
    return torch.relu(t) + 1


def _wrap(x):
    from torch._higher_order_ops.wrap import wrap

    return wrap(lambda t: torch.relu(t) * 2, x) + 1


def _invoke(x):
    return _block(_block(x) * 2)


def _flex(x):
    from torch.nn.attention.flex_attention import flex_attention

    q = x.view(1, 1, 8, 16)
    return flex_attention(q, q, q, score_mod=lambda s, b, h, qi, kv: torch.relu(s) + (qi - kv))


def _functionalized(x):
    y = x.clone()
    torch.ops.rafx.bump(y)
    return torch.relu(y) * 2


def _effects(x):
    return torch.relu(torch.ops.rafx.tick(x)) * 2


def _nested(x):
    from torch._higher_order_ops.cond import cond
    from torch.utils.checkpoint import checkpoint

    def region(t):
        return cond(t.sum() > 0, lambda u: torch.relu(u) * 2, lambda u: u - 1, (t,)) + 1

    return checkpoint(region, x, use_reentrant=False)


#: a higher-order operator inside another's subgraph: a ``cond`` inside a checkpointed region
NESTED = ("nested", _nested, "dynamo")

PROGRAMS = [
    ("cond", _cond, "dynamo"), ("while_loop", _while, "dynamo"), ("map", _map, "dynamo"),
    ("checkpoint", _checkpoint, "dynamo"), ("wrap", _wrap, "dynamo"), ("invoke_subgraph", _invoke, "dynamo"),
    ("flex_attention", _flex, "dynamo"),
    ("cond", _cond, "aot"), ("while_loop", _while, "aot"),
    ("auto_functionalized", _functionalized, "aot"), ("with_effects", _effects, "aot"),
]


def graph_of(fn, level: str) -> fx.GraphModule:
    """The graph torch.compile hands a backend for ``fn`` (after AOTAutograd, with ``"aot"``)."""
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd

    seen: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, example_inputs):
        seen.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=aot_autograd(fw_compiler=keep) if level == "aot" else keep,
                      fullgraph=True)(torch.randn(8, 16))
    finally:
        torch._dynamo.reset()
    (gm,) = seen
    return gm

"""FX node meta: what Dynamo, AOTAutograd and Inductor write into ``node.meta``, and FX's own
private naming of a call target.

``node.meta`` is a plain dict whose keys belong to whoever writes them, and none is a promise:
Dynamo puts a traced node's fake value under ``example_value`` and a placeholder's ``GraphArg``
(its source) under ``grapharg``; AOTAutograd and ``make_fx`` put theirs under ``val`` (and
``tensor_meta``, the older summary); AOTAutograd describes each input of the graph it hands
Inductor under ``desc`` (``PlainAOTInput`` ...); tracing keeps ``stack_trace`` and
``nn_module_stack``. Every read and write of these keys is here, named for what it asks, so a key
that moves is changed in one place. The archive's own ``NodeRecord.meta`` (``format.schema``) is
another dict, read where no FX node exists, and is not here.

``torch.fx.node._get_qualified_name`` is how FX names a call target (``torch.nn.functional.relu``);
the graph codec records targets by it.

Checked with 2.11.0, 2.13.0 and 2.15.0: all three write the same keys with the same meaning.
"""

from __future__ import annotations

from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    'node.meta["desc"]',
    'node.meta["example_value"]',
    'node.meta["grapharg"]',
    'node.meta["nn_module_stack"]',
    'node.meta["stack_trace"]',
    'node.meta["tensor_meta"]',
    'node.meta["unbacked_bindings"]',
    'node.meta["val"]',
    "torch.fx.node._get_qualified_name",
)


def value_of(node: Any) -> Any:
    """The value a trace recorded for ``node``: ``val`` (AOTAutograd, ``make_fx``) when the node
    has one (even None), else ``example_value`` (Dynamo), else a meta tensor of the shape, stride
    and dtype ``tensor_meta`` (the older summary) gives, else None."""
    if "val" in node.meta:
        return node.meta["val"]
    if "example_value" in node.meta:
        return node.meta["example_value"]
    tm = node.meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "shape"):
        import torch

        return torch.empty(0).new_empty_strided(tuple(tm.shape), tuple(tm.stride), dtype=tm.dtype, device="meta")
    return None


def example_value_of(node: Any) -> Any:
    """Dynamo's ``example_value`` of ``node``, else its ``val``, else None."""
    return node.meta.get("example_value", node.meta.get("val"))


def val_of(node: Any) -> Any:
    """``val`` alone (AOTAutograd's and ``make_fx``'s value), or None."""
    return node.meta.get("val")


def module_stack_of(node: Any) -> Any:
    """``nn_module_stack``: the modules the traced call was inside, or None."""
    return node.meta.get("nn_module_stack")


def graph_arg_of(node: Any) -> Any:
    """Dynamo's ``GraphArg`` of a placeholder (its ``source`` names the input), or None."""
    return node.meta.get("grapharg")


def aot_input_of(node: Any) -> tuple[str, Any] | None:
    """Which input of its own a placeholder of the graph AOTAutograd hands Inductor is, by the
    descriptor AOTAutograd leaves under ``desc``: ``("plain", idx)`` for ``PlainAOTInput`` (the
    idx-th input Dynamo passed), ``("state", target)`` for ``ParamAOTInput`` and
    ``BufferAOTInput`` (a parameter or buffer of Dynamo's graph module), None for anything else
    (a backward graph's activations and tangents). The descriptor classes are read by name:
    ``torch._functorch._aot_autograd.descriptors`` is never imported for them."""
    desc = node.meta.get("desc")
    kind = type(desc).__name__
    if kind == "PlainAOTInput":
        return "plain", getattr(desc, "idx", None)
    if kind in ("ParamAOTInput", "BufferAOTInput"):
        return "state", getattr(desc, "target", None)
    return None


def fake_values(gm: Any, fake_mode: Any, fakes: list[Any]) -> dict[str, Any]:
    """Each op node's fake tensor value when ``gm`` runs in ``fake_mode`` on the placeholders'
    ``fakes``, by node name; ``gm``'s meta is left as it was (the propagation writes ``val``
    and ``unbacked_bindings``)."""
    import torch
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    values = {n: n.meta["val"] for n in gm.graph.nodes if "val" in n.meta}
    bindings = {n: n.meta["unbacked_bindings"] for n in gm.graph.nodes if "unbacked_bindings" in n.meta}
    try:
        FakeTensorProp(gm, mode=fake_mode).propagate_dont_convert_inputs(*fakes)
        return {n.name: n.meta["val"] for n in gm.graph.nodes
                if n.op not in ("placeholder", "output") and isinstance(n.meta.get("val"), torch.Tensor)}
    finally:
        for n in gm.graph.nodes:
            n.meta.pop("val", None)
            n.meta.pop("unbacked_bindings", None)
            if n in values:
                n.meta["val"] = values[n]
            if n in bindings:
                n.meta["unbacked_bindings"] = bindings[n]


def set_example_value(node: Any, value: Any) -> None:
    """Give ``node`` the ``example_value`` a backend reads as Dynamo's (a fake value)."""
    node.meta["example_value"] = value


def forget_values(node: Any) -> None:
    """Drop what ``node``'s meta says about its value (``val``, ``tensor_meta``): for a node
    that now stands for another value."""
    node.meta.pop("val", None)
    node.meta.pop("tensor_meta", None)


def drop_stack_trace(node: Any) -> None:
    node.meta.pop("stack_trace", None)


def stack_trace_of(node: Any) -> str | None:
    """The source frames the node was traced at, printed as a traceback prints them, or None."""
    return node.meta.get("stack_trace")


def set_stack_trace(node: Any, text: str) -> None:
    node.meta["stack_trace"] = text


def qualified_name(target: Any) -> str:
    """FX's name for a call target: ``torch.nn.functional.relu``, ``_operator.add``."""
    from torch.fx.node import _get_qualified_name

    return _get_qualified_name(target)

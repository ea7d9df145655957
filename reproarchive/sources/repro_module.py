"""The dump's ``Repro`` module as a GraphModule whose placeholders match ``load_args`` one to one,
with module state PyTorch replaced by ``torch.randn`` (or a log does not hold) lifted into inputs
marked absent; shared by the dump import and the TORCH_TRACE import."""

from __future__ import annotations

from typing import Any

from reproarchive.compat.dispatch import hop_calls_recorded
from reproarchive.compat.fx_meta import drop_stack_trace
from reproarchive.compat.pytree import tree_leaves

# PyTorch inlines buffers with at most this many elements as printed literals
# (torch._dynamo.debug_utils.MAX_CONSTANT_NUMEL_INLINE); larger ones become torch.randn.
_INLINE_NUMEL = 4
# Module state that is not the model's and becomes an input marked absent: what PyTorch wrote
# as torch.randn or constructor defaults, and constants a TORCH_TRACE log does not hold.
LIFTED_ORIGINS = ("random", "defaults", "not_logged")


def module_state_origin(mod) -> dict[str, str]:
    """For every parameter/buffer of the dump's ``Repro``: "random", "defaults" or "printed".

    This mirrors torch._dynamo.debug_utils.NNModuleToString: top-level parameters and buffers
    above 4 elements are written as ``torch.randn``/``torch.randint`` (random); submodules are
    written as constructor calls (their state is the constructor's initialisation, not the
    model's); buffers of at most 4 elements are printed literals (real values, but floats are
    rounded to the printed precision).
    """
    origin: dict[str, str] = {}
    for name, _ in mod.named_parameters():
        origin[name] = "random" if "." not in name else "defaults"
    for name, buf in mod.named_buffers():
        if "." in name:
            origin[name] = "defaults"
        elif buf.numel() <= _INLINE_NUMEL:
            origin[name] = "printed" if buf.is_floating_point() or buf.is_complex() else "real"
        else:
            origin[name] = "random"
    return origin


def trace_repro(mod) -> tuple[Any, list[str]]:
    """GraphModule for ``Repro``: its forward, one placeholder per load_args input.

    ``Repro.forward`` is the FX code of the graph PyTorch dumped, so re-tracing it symbolically
    gives back that graph with the same targets (torch-level for after_dynamo, ATen for
    after_aot), without running it and without needing input data. Submodules are inlined so
    their state becomes get_attr nodes that can be lifted; when a submodule cannot be traced
    through (data-dependent checks in its forward), it is kept as a call_module.
    """
    import torch.fx as fx


    notes: list[str] = []

    class _Leaf(fx.Tracer):
        proxy_buffer_attributes = True

        def trace(self, root, concrete_args=None):
            def record(op, args, kwargs):
                return self.create_proxy("call_function", op, args, kwargs)

            with _calls_stay_nodes(self), hop_calls_recorded(record, lambda v: isinstance(v, fx.Proxy)):
                return super().trace(root, concrete_args)

    class _Inline(_Leaf):
        def is_leaf_module(self, m, qualname):
            return False

    try:
        graph = _Inline().trace(mod)
    except Exception as err:
        notes.append(f"submodules kept as calls (inlining failed: {type(err).__name__})")
        graph = _Leaf().trace(mod)
    gm = fx.GraphModule(mod, graph, class_name="Repro")
    for node in gm.graph.nodes:
        drop_stack_trace(node)
        if node.op == "get_attr":
            notes += _subgraph_traced(gm, node.target)
        if node.op == "placeholder":
            node.type = None  # Repro's annotations (torch.nn.parameter.Parameter) carry nothing
    gm.recompile()
    return gm, notes


def _subgraph_traced(gm, target: str) -> list[str]:
    """A subgraph a higher-order operator takes (``self.cond_true_0``) is a printed class in the
    log or script, not a GraphModule: traced the same way and put back in its place."""
    import torch
    import torch.fx as fx

    sub = _resolve_attr(gm, target)
    if not isinstance(sub, torch.nn.Module) or isinstance(sub, fx.GraphModule):
        return []
    traced, notes = trace_repro(sub)
    owner, _, name = target.rpartition(".")
    setattr(_resolve_attr(gm, owner) if owner else gm, name, traced)
    return notes


def _calls_stay_nodes(tracer):
    """A torch function mode under which a call of the graph's code that takes no graph value
    (``aten.rand.default([8, 8], device=...)``, ``prims.inductor_seeds.default(1, device)``,
    ``torch.zeros(3)``) is recorded as a node, as it was in the graph PyTorch wrote, instead of
    being run once while tracing and frozen into a constant: run, it would bake one draw of a
    random op into the archive as if it were data, and a factory for a device this machine lacks
    ("Torch not compiled with CUDA enabled") could not be traced at all. Constructors of plain
    values (``torch.device``, ``torch.Size``) still run."""
    import torch.fx as fx
    from torch.overrides import TorchFunctionMode


    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if isinstance(func, type) or any(isinstance(a, fx.Proxy) for a in tree_leaves((args, kwargs))):
                return func(*args, **kwargs)
            return tracer.create_proxy("call_function", func, args, kwargs)

    return _Mode()


def lift_state(gm, origin: dict[str, str], example_inputs: list[Any]) -> tuple[Any, list[Any], list[dict]]:
    """Turn get_attr nodes of state PyTorch did not save into leading inputs marked absent.

    The archive stores module state as real data; storing ``torch.randn`` output there would
    present random numbers as the model's weights. As inputs with fidelity "absent" they are
    generated at load time with a loud warning instead, which is the truth.
    """
    import torch
    import torch.fx as fx

    from reproarchive.codec.tensors import AbsentTensor

    lifted: list[dict] = []
    new_inputs: list[Any] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[0] if placeholders else next(iter(gm.graph.nodes))
    by_target: dict[str, fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "get_attr" or origin.get(node.target) not in LIFTED_ORIGINS:
            continue
        value = _resolve_attr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        if node.target not in by_target:
            name = "state_" + node.target.replace(".", "_")
            with gm.graph.inserting_before(anchor):
                ph = gm.graph.placeholder(name)
            by_target[node.target] = ph
            new_inputs.append(AbsentTensor(tuple(value.shape), value.dtype, stride=tuple(value.stride()),
                                           storage_offset=0, device=str(value.device),
                                           requires_grad=bool(value.requires_grad)))
            lifted.append({"attribute": node.target, "placeholder": ph.name,
                           "origin": origin[node.target]})
        node.replace_all_uses_with(by_target[node.target])
        gm.graph.erase_node(node)
    if not lifted:
        return gm, example_inputs, lifted
    gm.graph.lint()
    new_gm = fx.GraphModule(gm, gm.graph, class_name="Repro")
    return new_gm, new_inputs + list(example_inputs), lifted


def _resolve_attr(root, target: str):
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def graph_summary(gm) -> dict[str, Any]:
    """Size and op kinds of the graph as the archive will store it (one way of counting ops)."""
    from reproarchive.codec.graphs import encode_graph
    from reproarchive.codec.tensors import StorageTable

    record = encode_graph(gm, StorageTable())
    histogram = record.op_histogram()
    node_ops: dict[str, int] = {}
    for node in record.nodes:
        node_ops[node.op] = node_ops.get(node.op, 0) + 1
    return {"nodes": len(record.nodes), "compute_nodes": record.op_count(), "op_kinds": len(histogram),
            "node_ops": node_ops, "targets": dict(list(histogram.items())[:20])}

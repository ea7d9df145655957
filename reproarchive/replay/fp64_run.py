"""The float64 reference of the accuracy rule (``replay.accuracy``, step 4): the graph run node
by node in float64, each floating input cast where a node uses it.

It lives apart from the rule because it is a mechanism of its own (an FX interpreter that casts
at each use and frees each cast after its last use, and collects gradients per input), which
``check_accuracy`` calls and nothing else needs to read to follow the rule. The loss a backward
reduces the outputs to (PyTorch's) is here too, so that both runs take it without a cycle.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from reproarchive.codec.device_runtime import devices_of, synchronize
from reproarchive.compat.dynamo import cast_to_fp64
from reproarchive.compat.pytree import tree_leaves, tree_map
from reproarchive.replay.input_writes import run_inputs

# the loss a backward starts from (PyTorch's), shared with ``accuracy.run_forward_backward``


def _requires_bwd(out: Any) -> bool:
    return any(isinstance(x, torch.Tensor) and x.requires_grad for x in tree_leaves(out))


def _scalar_loss(out: Any) -> Any:
    """PyTorch's ``reduce_to_scalar_loss`` over every output that requires grad: the mean of
    each tensor, averaged. Outputs that do not require grad are left out (they cannot
    contribute a gradient and would fail on integer dtypes)."""
    parts = [x.sum() / max(x.numel(), 1) for x in tree_leaves(out)
             if isinstance(x, torch.Tensor) and x.requires_grad]
    return sum(parts) / len(parts)


def fp64_reference(gm: Any, args: Sequence[Any], *, fwd_only: bool = False,
                   written: frozenset[int] | None = None) -> tuple[dict | None, str | None]:
    """Run ``gm`` in float64, node by node (``_Float64Run``): float dtype arguments in the
    graph (``convert_element_type``, ``dtype=``) become float64 as PyTorch's ``cast_to_fp64``
    makes them, and each floating input is cast where a node uses it, the cast dropped after
    its last use.

    Why not ``cast_to_fp64`` on copies of the inputs, as PyTorch does: that holds a float64
    copy of every input -- the model's weights, since Dynamo passes them as inputs -- next
    to the model, 2x its fp32 size, for the whole run. Here a forward holds one input's cast
    at a time besides the activations; a backward keeps what autograd saves for it anyway.
    Gradients are taken with respect to the float64 casts (leaves, summed per input), so
    they are float64 as PyTorch's are.

    Returns ``(result, None)`` or ``(None, reason)`` when the graph cannot run in fp64 (some
    ops have no fp64 kernel on some devices); the accuracy rule then falls back to step 3.
    """
    try:
        model = cast_to_fp64(copy.deepcopy(gm).to(torch.float64))
        need_grads = not fwd_only and torch.is_grad_enabled()
        run = _Float64Run(model, need_grads)
        devices = devices_of(args)
        out = run.run(*run_inputs(args, written))
        synchronize(devices)
        grads: dict[int, Any] = {}
        if need_grads and _requires_bwd(out):
            _scalar_loss(out).backward()
            synchronize(devices)
            grads = run.grads()
        return {"outputs": out, "grads": grads}, None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _float64_run_base() -> type:
    return torch.fx.Interpreter


class _Float64Run(_float64_run_base()):  # type: ignore[misc]
    """An fx interpreter that casts floating inputs to float64 at each use; the interpreter
    frees every value after its last use, the casts with it (unless autograd saved them)."""

    def __init__(self, model: Any, need_grads: bool):
        super().__init__(model, garbage_collect_values=True)
        self.need_grads = need_grads
        self.index: dict[int, int] = {}  # id of an input tensor -> its position
        self.casts: list[tuple[int, Any]] = []  # (position, float64 leaf) for gradients

    def run_node(self, n: Any) -> Any:
        value = super().run_node(n)
        if n.op == "placeholder" and isinstance(value, torch.Tensor):
            self.index[id(value)] = len(self.index)
        return value

    def fetch_args_kwargs_from_env(self, n: Any) -> tuple:
        def cast(x: Any) -> Any:
            if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype == torch.float64:
                return x
            position = self.index.get(id(x))
            if position is None:
                return x.to(torch.float64)  # a value the graph made, in its own history
            leaf = x.detach().to(torch.float64).requires_grad_(self.need_grads and x.requires_grad)
            if leaf.requires_grad:
                self.casts.append((position, leaf))
            return leaf

        args, kwargs = super().fetch_args_kwargs_from_env(n)
        return tree_map(cast, args), tree_map(cast, kwargs)

    def grads(self) -> dict[int, Any]:
        out: dict[int, Any] = {}
        for position, leaf in self.casts:
            if leaf.grad is not None:
                out[position] = leaf.grad if position not in out else out[position] + leaf.grad
        return out

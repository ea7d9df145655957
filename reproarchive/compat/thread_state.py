"""Thread state torch keeps in ``torch._C`` without a public accessor: forward-mode AD and
functorch's transform levels.

A replayed graph may toggle them (``vmap`` regions Dynamo inlined, forward-AD), and a replay puts
them back afterwards (``replay.containment``); the minifier must not cut a value that lives inside
a functorch transform (``is_functorch_wrapped_tensor``). Grad mode and autocast have public
accessors and are not here.

``replay/containment.py`` still names the forward-AD and functorch-level functions itself (the file
is being changed elsewhere; ``tests/test_private_torch.py`` lists it as not moved yet): these are
the functions it is to call instead.

Checked with 2.11.0, 2.13.0 and 2.15.0: the same functions, with the same meaning, in all three.
"""

from __future__ import annotations

from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._C._functorch.get_dynamic_layer_stack_depth",
    "torch._C._functorch.is_functorch_wrapped_tensor",
    "torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth",
    "torch._C._is_fwd_grad_enabled",
    "torch._C._set_fwd_grad_enabled",
)


def is_fwd_grad_enabled() -> bool:
    """Whether forward-mode AD is on in this thread."""
    import torch

    return torch._C._is_fwd_grad_enabled()


def set_fwd_grad_enabled(enabled: bool) -> None:
    import torch

    torch._C._set_fwd_grad_enabled(enabled)


def functorch_depth() -> int:
    """How many functorch transforms (``vmap``, ``grad`` ...) this thread is inside."""
    import torch

    return torch._C._functorch.get_dynamic_layer_stack_depth()


def leave_functorch_levels(depth: int) -> None:
    """Leave every functorch transform entered above ``depth``."""
    import torch

    torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)


def is_functorch_wrapped_tensor(t: Any) -> bool:
    """Whether ``t`` is a value inside a functorch transform (a batched or grad-tracking wrapper)."""
    import torch

    return torch._C._functorch.is_functorch_wrapped_tensor(t)

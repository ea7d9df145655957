"""Tensor internals: subclasses torch defines in private modules, and the metadata torch keeps
beside a tensor.

A tensor subclass is recorded by its inner tensors and rebuilt through its unflatten protocol;
whether a tensor is such a subclass is ``torch.utils._python_dispatch``'s question
(``is_traceable_wrapper_subclass``), and the subclasses a replay rebuilds are torch's own
(``REBUILDABLE_SUBCLASSES``), defined in private modules (``torch.testing._internal``,
``torch.nested._internal``), imported by their module name from this table only. PyTorch's dump
scripts rebuild an input's extra metadata with ``torch._utils.set_tensor_metadata``, as the
dump reader does.

Checked with 2.11.0, 2.13.0 and 2.15.0: all three define the two subclasses in the same modules and the two
functions with the same meaning.
"""

from __future__ import annotations

import importlib
from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch._utils.set_tensor_metadata",
    "torch.nested._internal.nested_tensor",
    "torch.nested._internal.nested_tensor.NestedTensor",
    "torch.testing._internal.two_tensor",
    "torch.testing._internal.two_tensor.TwoTensor",
    "torch.utils._python_dispatch.is_traceable_wrapper_subclass",
)

#: Tensor subclasses a replay rebuilds: classes torch itself defines, by the module that defines
#: them (the recorded class name -> (module, class)). A class is found here, never by importing
#: a name an archive gives. The exported script carries this table too (``standalone.script``).
REBUILDABLE_SUBCLASSES: dict[str, tuple[str, str]] = {
    "torch.testing._internal.two_tensor.TwoTensor": ("torch.testing._internal.two_tensor", "TwoTensor"),
    "torch.nested._internal.nested_tensor.NestedTensor": ("torch.nested._internal.nested_tensor", "NestedTensor"),
}


def rebuildable_subclass(recorded: str) -> type | None:
    """The class ``REBUILDABLE_SUBCLASSES`` names for a recorded class name, imported from its
    module; None for any other name."""

    where = REBUILDABLE_SUBCLASSES.get(recorded)
    if where is None:
        return None
    return getattr(importlib.import_module(where[0]), where[1])  # a module of torch's own, from the table


def is_traceable_wrapper_subclass(t: Any) -> bool:
    """Whether ``t`` is a tensor subclass that flattens into inner tensors (``__tensor_flatten__``)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass as traceable

    return traceable(t)


def set_tensor_metadata(t: Any, metadata: Any) -> None:
    """Set the extra metadata PyTorch's dumps record for an input tensor."""
    import torch

    torch._utils.set_tensor_metadata(t, metadata)

"""Pytrees: ``torch.utils._pytree`` (and ``torch.fx._pytree``), torch's flattening of nested
containers, which has no public home.

The accuracy check flattens outputs and gradients with key paths to name what differs
(``output[0]``), the capture walks outputs' leaves to find autograd nodes, and a graph Dynamo
printed into a ``TORCH_TRACE`` log calls both modules by the names Dynamo gives them there
(``pytree``, ``fx_pytree``), so the trace source rebuilds it with both in scope.

Checked with 2.11.0, 2.13.0 and 2.15.0: the functions used here behave the same in all three.
"""

from __future__ import annotations

from typing import Any, Callable

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = (
    "torch.fx._pytree",
    "torch.utils._pytree",
    "torch.utils._pytree.keystr",
    "torch.utils._pytree.tree_flatten_with_path",
    "torch.utils._pytree.tree_leaves",
    "torch.utils._pytree.tree_map",
)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree``, in order."""
    from torch.utils._pytree import tree_leaves as leaves

    return leaves(tree)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with every leaf replaced by ``fn(leaf)``."""
    from torch.utils._pytree import tree_map as mapped

    return mapped(fn, tree)


def tree_flatten_with_path(tree: Any) -> tuple[list[tuple[tuple, Any]], Any]:
    """((key path, leaf) pairs, spec) of ``tree``."""
    from torch.utils._pytree import tree_flatten_with_path as flattened

    return flattened(tree)


def keystr(path: tuple) -> str:
    """A key path as text: ``['outputs'][0]``."""
    from torch.utils._pytree import keystr as text

    return text(path)


def graph_code_modules() -> dict[str, Any]:
    """The pytree modules a graph's code printed by Dynamo names: ``pytree`` and ``fx_pytree``."""
    import torch

    return {"fx_pytree": torch.fx._pytree, "pytree": torch.utils._pytree}

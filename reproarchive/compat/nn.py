"""``torch.nn``'s private base classes.

Dropout modules advance the random generator in training mode, so a graph that calls one
through its module (``call_module``) is random (``codec.rng``). They share a private base class,
``torch.nn.modules.dropout._DropoutNd``, which covers a user's subclass of one too.

Checked with 2.11.0, 2.13.0 and 2.15.0: the same base class, in the same module, in all three.
"""

from __future__ import annotations

from typing import Any

CHECKED_WITH = ("2.11.0", "2.13.0", "2.15.0")

PRIVATE_NAMES = ("torch.nn.modules.dropout._DropoutNd",)


def is_dropout(module: Any) -> bool:
    """Whether ``module`` is one of torch's dropout modules (or a subclass of one)."""
    import torch

    return isinstance(module, torch.nn.modules.dropout._DropoutNd)

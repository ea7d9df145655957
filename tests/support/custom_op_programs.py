"""Sources of Python custom ops for the programs tests run in a subprocess (``ns::twice``, ``ns::checked``)."""

from __future__ import annotations


def twice_library(namespace: str) -> str:
    """A module defining ``<namespace>::twice`` (x * 2) with a fake implementation."""
    return f'''
import torch

@torch.library.custom_op("{namespace}::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@twice.register_fake
def _(x):
    return torch.empty_like(x)
'''


def refusing_library(namespace: str) -> str:
    """A module defining ``<namespace>::checked`` (a copy of x) that raises on a value over 10:
    a failure that depends on a call's data, for a later call to hit."""
    return f'''
import torch

@torch.library.custom_op("{namespace}::checked", mutates_args=())
def checked(x: torch.Tensor) -> torch.Tensor:
    if x.abs().max() > 10:
        raise RuntimeError("{namespace}: a value over 10 was refused")
    return x.clone()

checked.register_fake(lambda x: torch.empty_like(x))
'''

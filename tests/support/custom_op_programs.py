"""Source of a Python custom op for the programs tests run in a subprocess (``ns::twice``)."""

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

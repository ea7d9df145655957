"""Custom compiler functions whose compiled code fails on some calls only, as real bugs do
("fails after N steps", "fails at the last, smaller batch"). Importable as
``support.later_call_backends:NAME``, so archives that record them replay with ``--backend``."""

from __future__ import annotations

import torch


def fails_on_negative(gm, example_inputs):
    """Compiled code that raises when its first tensor input starts with a negative number."""

    def run(*args):
        first = next(a for a in args if isinstance(a, torch.Tensor))
        if first.reshape(-1)[0] < 0:
            raise RuntimeError("compiled kernel rejects a negative first element")
        return gm(*args)

    return run


def fails_on_size_7(gm, example_inputs):
    """Compiled code that raises when a tensor input has a dimension of size 7."""

    def run(*args):
        if any(isinstance(a, torch.Tensor) and 7 in a.shape for a in args):
            raise RuntimeError("compiled kernel fails for size 7")
        return gm(*args)

    return run


def fails_after_running(gm, example_inputs):
    """Compiled code that runs the graph (its in-place writes and random draws included) and
    then raises, as a kernel that fails after writing its output does."""

    def run(*args):
        gm(*args)
        raise RuntimeError("compiled kernel failed after running")

    return run


class BrokenGrad(torch.autograd.Function):
    """The identity, whose backward raises."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("injected backward failure")


def fails_in_backward(gm, example_inputs):
    """Compiled code whose forward passes and whose backward raises."""

    def run(*args):
        out = gm(*args)
        return tuple(BrokenGrad.apply(o) if isinstance(o, torch.Tensor) and o.requires_grad else o for o in out)

    return run

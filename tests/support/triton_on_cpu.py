"""Triton kernels on CPU tensors, for tests on machines without a GPU: Dynamo is told Triton is
usable (so it puts user kernels into graphs as launches, as on a GPU), and a kernel launch runs
through Triton's own interpreter (``TRITON_INTERPRET``'s engine) instead of a GPU driver.
Imported by test programs, and by `run --import` where the real kernel must run."""

import torch.utils._triton as _torch_triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_torch_triton.has_triton = lambda **_: True  # torch 2.15 asks has_triton(include_cpu=True)


def _interpreted(self, *args, grid, warmup, **kwargs):
    return InterpretedFunction(self.fn).run(*args, grid=grid, warmup=warmup, **kwargs)


JITFunction.run = _interpreted

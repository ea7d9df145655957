"""Small archives that share blobs the way a model's failures do (store tests and benchmark)."""

from __future__ import annotations

import itertools

import torch
import torch.fx as fx

import reproarchive

_COUNTER = itertools.count()


class Model(torch.nn.Module):
    def forward(self, w0, w1, w2, w3, x):
        return ((x @ w0).relu() @ w1 + w2.sum() - w3.mean()).tanh()


def make_archive(path, *, shared_seed: int = 0, own_seed: int | None = None,
                 signature: str = "compile|RuntimeError|boom",
                 backend: str = "eager", frame_size: int = 64 << 10, level: int = 1):
    """A small archive: three weights from ``shared_seed`` (shared between archives that give the
    same seed), one input of its own, and a recorded failure. Frames of 64 KiB give every blob
    several frames."""
    gen = torch.Generator().manual_seed(shared_seed)
    weights = [torch.randn(128, 128, generator=gen), torch.randn(128, 64, generator=gen),
               torch.randn(64, 64, generator=gen)]
    own = torch.Generator().manual_seed(1000 + (own_seed if own_seed is not None else next(_COUNTER)))
    w3 = torch.randn(96, 96, generator=own)
    x = torch.randn(16, 128, generator=own)
    stage, exc_type, message = signature.split("|")
    reproarchive.pack(fx.symbolic_trace(Model()), [*weights, w3, x], path, frame_size=frame_size, level=level,
                      backend=backend,
                      failure={"stage": stage, "exception_type": exc_type, "message": message, "signature": signature})
    return path

"""Input moves: what shrinking a shape, narrowing a dtype or filling with zeros does to a value.

Deleting nodes stops at the smallest failing *graph*; its inputs can still be 1x3x224x224
tensors of real data. These moves make the inputs small too, and every one of them changes
what the inputs hold, so each result carries a label that says how far it is from the
recorded data -- the archive's ``minify`` record stores it per input, so a minified repro is
never passed off as the original data:

* ``cropped``: a shape was shrunk; the values are the leading block of the recorded values
  (``x[:a, :b]``), laid out again in the recorded dimension order (a transposed or
  channels-last input stays so) and with broadcast (stride 0) dimensions still broadcast, so
  the strides are valid for the new shape;
* ``cast``: the recorded values converted to a narrower dtype (rounded, so no longer the data);
* ``zeros`` / ``ones``: synthetic values that have nothing to do with the recorded data.

A transform is plain hashable data, ``Transform(shape, dtype, fill)``, applied in that order; it
is part of a candidate's normal form, so the memo never judges the same inputs twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from reproarchive.compat.tensor_internals import is_traceable_wrapper_subclass

# One step narrower; the failure decides whether the step is taken.
NARROWER = {
    torch.float64: torch.float32,
    torch.float32: torch.float16,
    torch.complex128: torch.complex64,
    torch.int64: torch.int32,
}

# How much recorded information an input carries: recorded > ones > zeros (a tie-breaker
# between candidates of equal size).
_DATA_COST = {None: 2, 1: 1, 0: 0}


@dataclass(frozen=True)
class Transform:
    """How a candidate input differs from the recorded value: new shape, dtype, constant fill."""

    shape: tuple[int, ...] | None = None
    dtype: str | None = None   # torch dtype name without "torch."
    fill: int | None = None    # 0 or 1

    def merged(self, **changes: Any) -> "Transform":
        return Transform(**{"shape": self.shape, "dtype": self.dtype, "fill": self.fill, **changes})


IDENTITY = Transform()


def dtype_of(name: str) -> torch.dtype:
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _layout(src: torch.Tensor, shape: tuple[int, ...]) -> tuple[list[int], list[int], list[bool]]:
    """(base shape, dense strides in the recorded dimension order, broadcast dims) for ``shape``."""
    n = src.dim()
    broadcast = [src.stride(d) == 0 and src.size(d) > 1 for d in range(n)]
    base = [1 if broadcast[d] else shape[d] for d in range(n)]
    # innermost first: the recorded stride order, later dims first among equals (row-major default)
    order = sorted(range(n), key=lambda d: (src.stride(d), -d))
    strides = [0] * n
    acc = 1
    for d in order:
        strides[d] = acc
        acc *= max(base[d], 1)
    return base, strides, broadcast


def apply(value: Any, t: Transform) -> Any:
    """``value`` with ``t`` applied: a fresh tensor (the recorded one is never touched)."""
    if t == IDENTITY or not isinstance(value, torch.Tensor):
        return value
    src = value.detach()
    shape = tuple(src.shape) if t.shape is None else tuple(t.shape)
    dtype = src.dtype if t.dtype is None else dtype_of(t.dtype)
    base_shape, strides, broadcast = _layout(src, shape)
    with torch.no_grad():
        out = torch.empty_strided(base_shape, strides, dtype=dtype, device=src.device)
        if t.fill is not None:
            out.fill_(t.fill)
        else:
            block = src[tuple(slice(0, b) for b in base_shape)] if src.dim() else src
            out.copy_(block)
        if any(broadcast):
            out = out.expand(shape)
    if value.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


def meta(value: Any, t: Transform) -> tuple:
    """What the memo key needs to know about a transformed input, without building it."""
    if not isinstance(value, torch.Tensor):
        return ("S", type(value).__name__, value if _hashable(value) else id(value))
    shape = tuple(value.shape) if t.shape is None else tuple(t.shape)
    dtype = dtype_name(value.dtype) if t.dtype is None else t.dtype
    return ("T", shape, tuple(value.stride()), value.storage_offset(), dtype, str(value.device),
            value.requires_grad, t.shape is not None, t.fill)


def cost(value: Any, t: Transform) -> tuple[int, int]:
    """(bytes, recorded-data weight) of one input: what input moves make smaller."""
    if not isinstance(value, torch.Tensor):
        return 0, 0
    if is_traceable_wrapper_subclass(value):  # a nested jagged tensor (its size j1 has no value): its inner tensors
        inner = [cost(getattr(value, a), IDENTITY) for a in value.__tensor_flatten__()[0]]
        return sum(c[0] for c in inner), sum(c[1] for c in inner)
    shape = tuple(value.shape) if t.shape is None else tuple(t.shape)
    dtype = value.dtype if t.dtype is None else dtype_of(t.dtype)
    numel = 1
    for s in shape:
        numel *= s
    return numel * dtype.itemsize, _DATA_COST[t.fill]


def label(value: Any, t: Transform) -> dict[str, Any]:
    """The provenance of a transformed input, for the archive's ``minify`` record."""
    out: dict[str, Any] = {"values": "recorded"}
    if not isinstance(value, torch.Tensor):
        return out
    parts = []
    if t.shape is not None and tuple(t.shape) != tuple(value.shape):
        out["shape"] = {"recorded": list(value.shape), "now": list(t.shape)}
        parts.append("cropped")
    if t.dtype is not None and t.dtype != dtype_name(value.dtype):
        out["dtype"] = {"recorded": dtype_name(value.dtype), "now": t.dtype}
        parts.append("cast")
    if t.fill is not None:
        parts = ["zeros" if t.fill == 0 else "ones"]
    if parts:
        out["values"] = "+".join(parts)
    return out


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False

"""The dynamic-shape policy a text tells: a TORCH_TRACE log's graph annotations and
``create_symbol`` events, or a dumped script's ``load_args`` (``logged_policy``).

It lives apart from ``codec.shapes`` (which reads the policy from Dynamo's fake values and
ShapeEnv, and makes fakes from it for a replay) because reading a policy from what a log or a
script wrote needs neither: it is plain text to records, used by ``pack`` (``sources.trace.rebuild_child``,
``sources.dump.pack_child``) only. The records it makes are the ones ``codec.shapes`` makes
(``linked`` ties equal dimensions together).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from reproarchive.codec.shapes import BACKED, STATIC, UNBACKED, linked
from reproarchive.format.schema import ShapeDim, ShapeInput, ShapePolicy, ShapeSymbol


def logged_policy(records: Sequence[dict[str, Any]], symbols: dict[str, dict[str, Any]],
                  first_input: int = 0, recorded_from: str = "torch_trace") -> ShapePolicy | None:
    """The policy a TORCH_TRACE log (``torch_trace``) or a dumped script's ``load_args``
    (``dump``) tells: per input, the symbolic sizes written in the graph's annotations or the
    script's syntax (``symbolic_shape``, ``expr``), with the hints, sources and ranges of a log's
    ``create_symbol`` events (a dump has none). Neither says what made a dimension dynamic, nor
    renders guards as a replay renders them: ``origin`` and ``guards`` stay empty. ``records``
    are the source's input records, input ``first_input + j`` for record ``j``; None when
    nothing in them is symbolic."""
    out = []
    for j, rec in enumerate(records):
        if rec.get("kind") == "tensor" and isinstance(rec.get("shape"), list):
            logged = rec.get("symbolic_shape") or rec["shape"]
            dims = tuple(_logged_dim(d, size, symbols) for d, size in zip(logged, rec["shape"]))
            out.append(ShapeInput(input=first_input + j, kind="tensor", source=rec.get("source"), dims=dims))
        elif rec.get("kind") == "symint" and isinstance(rec.get("expr"), str):
            out.append(ShapeInput(input=first_input + j, kind="symint", source=rec.get("source"),
                                  dims=(_logged_dim(rec["expr"], rec.get("hint"), symbols),)))
    if not any(d.kind != STATIC for r in out for d in r.dims):
        return None
    table = tuple(ShapeSymbol(name=name, kind=UNBACKED if name.startswith("u") else BACKED,
                              hint=info.get("hint") if type(info.get("hint")) is int else None,
                              min=_logged_range(info.get("range"))[0], max=_logged_range(info.get("range"))[1],
                              sources=(info["source"],) if isinstance(info.get("source"), str) else ())
                  for name, info in sorted(symbols.items()))
    return ShapePolicy(recorded_from=recorded_from, inputs=linked(out), symbols=table)


def _logged_dim(logged: Any, size: Any, symbols: dict[str, dict[str, Any]]) -> ShapeDim:
    size = size if type(size) is int else None
    if type(logged) is int:
        return ShapeDim(kind=STATIC, size=logged)
    info = symbols.get(str(logged)) or {}
    low, high = _logged_range(info.get("range"))
    return ShapeDim(kind=UNBACKED if str(logged).startswith("u") else BACKED, size=size, expr=str(logged),
                    source=info.get("source") if isinstance(info.get("source"), str) else None, min=low, max=high)


def _logged_range(text: Any) -> tuple[int | None, int | None]:
    """``[2, int_oo]`` (a ``create_symbol`` event's ``vr``) as (2, None)."""
    m = re.fullmatch(r"(?:VR)?\[\s*(-?\w+)\s*,\s*(-?\w+)\s*\]", text.strip()) if isinstance(text, str) else None
    if not m:
        return None, None
    return tuple(int(v) if re.fullmatch(r"-?\d+", v) and abs(int(v)) < (1 << 62) else None for v in m.groups())

"""Shape guards as Dynamo renders them, and the part of them Dynamo made apart from the part
the backend's compile added (spec §8 ``shapes.entry``).

Why the two parts. A backend adds guards while it compiles: Inductor bounds a size it indexes
with (``s77 <= 4096``). A policy read when the compile ended holds both, and a replay that
re-asserted all of them handed its own compile a ShapeEnv that already had the bound, so the
compile could neither add it nor miss it and its guards equalled the recorded ones whatever it
did; a replay with another backend (``--backend eager``) was judged against a bound that
backend never makes. So a capture notes the ShapeEnv when the backend is entered
(``note_entry``, on the graph it later reads the policy from), the policy carries the note, a
replay re-asserts only what Dynamo made (``entry_shape_guards``), and the verdict compares the
guards after the compile for the recorded backend, before it for another one.

The note costs one rendering of the guards per compile of a graph with symbols (nothing for a
static graph). It is kept beside the graph module, by weak reference, so every capture route
that holds the graph finds it without being handed it; not in the module's ``meta``, which is
the program's (AOTAutograd's cache key pickles it: a note there would change the program's
cache hits).
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from reproarchive.compat.dynamo import constant_source
from reproarchive.compat.fake import shape_env_of_fake
from reproarchive.compat.fx_meta import example_value_of, graph_arg_of
from reproarchive.compat.shape_guard_text import rendered_guards
from reproarchive.format.schema import ShapeEntry, ShapePolicy

_NOTED: weakref.WeakKeyDictionary[Any, ShapeEntry] = weakref.WeakKeyDictionary()


def placeholder_facts(gm: Any) -> tuple[list[Any], list[str | None], Any]:
    """(each placeholder's fake value, the source Dynamo read it from, the ShapeEnv they
    share, None when they carry no fake values: a graph that did not come from Dynamo)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [example_value_of(n) for n in placeholders]
    return values, [_source_of(n) for n in placeholders], _shape_env_of(values)


def _shape_env_of(values: Sequence[Any]):
    for v in values:
        if (shape_env := shape_env_of_fake(v)) is not None:
            return shape_env
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return v.node.shape_env
    return None


def _source_of(node: Any) -> str | None:
    grapharg = graph_arg_of(node)
    source = getattr(grapharg, "source", None)
    name = getattr(source, "name", None)
    name = name() if callable(name) else name
    return name if isinstance(name, str) else None


def policy_guards(shape_env, values: Sequence[Any], sources: Sequence[str | None]) -> list[str]:
    """The shape guards as Dynamo renders them (``2 <= L['x'].size()[0] <= 64``), over the
    inputs that have a source; a replay renders its own the same way (``ReplayShapes.guards``)."""
    if not shape_env.var_to_range:  # no symbol: static shapes have no shape guards to render
        return []
    try:
        return rendered_guards(shape_env, values, [source_named(s) if s else None for s in sources])
    except Exception:  # noqa: BLE001 - guards that cannot be rendered are left out
        return []


def source_named(name: str):
    """A Dynamo source that prints as ``name``: symbol names are derived from source names, so
    a replay's symbols and guard text match the recording's."""
    return constant_source(name)


# --------------------------------------------------------------------------------------------
# the guards at backend entry


def note_entry(gm: Any) -> None:
    """Note beside ``gm`` the ShapeEnv its placeholders' fake values share, as it is now: call
    it when the backend is entered, before the compile. Never raises: without the note a policy
    has no ``entry``, as an older writer's."""
    try:
        values, sources, shape_env = placeholder_facts(gm)
        if shape_env is None or not shape_env.var_to_range:  # static: a compile adds no shape guard
            return
        _NOTED[gm] = ShapeEntry(guards=tuple(policy_guards(shape_env, values, sources)),
                                shape_guards=len(shape_env.guards))
    except Exception:  # noqa: BLE001 - recording is best effort, never in place of the program's compile
        return


def noted_entry(gm: Any) -> ShapeEntry | None:
    """What ``note_entry`` noted beside ``gm``, if anything."""
    try:
        return _NOTED.get(gm)
    except TypeError:  # an object no weak reference can hold was never noted
        return None


def entry_shape_guards(policy: ShapePolicy) -> tuple[str, ...]:
    """The recorded shape guards a replay re-asserts: those Dynamo made where the policy says
    which they are, else (an older archive) all of them."""
    if policy.entry is None:
        return policy.shape_guards
    return policy.shape_guards[:policy.entry.shape_guards]


def restricted_entry(policy: ShapePolicy, kept_guard: Any, holds: Any) -> ShapeEntry | None:
    """``policy.entry`` for a minifier candidate whose policy keeps the rendered guards
    ``kept_guard`` accepts and the shape guards ``holds`` accepts (``codec.shapes.restricted``):
    the count becomes how many of the first ones are kept."""
    if policy.entry is None:
        return None
    kept = sum(1 for text in policy.shape_guards[:policy.entry.shape_guards] if holds(text))
    return ShapeEntry(guards=tuple(filter(kept_guard, policy.entry.guards)), shape_guards=kept)


def fixed_by_compile(policy: ShapePolicy) -> dict[str, str]:
    """The symbols the backend's compile fixed to a number (a guard ``Eq(s77, 4)`` it added,
    past ``entry``), by the sources they were read from: Dynamo handed the backend those sizes
    as symbols, and a replay hands them so too (``as_handed``), for its own compile to fix them
    or not. Empty for an archive that does not say which guards are Dynamo's."""
    if policy.entry is None:
        return {}
    added = policy.shape_guards[policy.entry.shape_guards:]
    made = policy.shape_guards[:policy.entry.shape_guards]
    out = {}
    for symbol in policy.symbols:
        name = re.escape(symbol.name)  # the archive's text: matched, never a pattern of its own
        fixed = re.compile(rf"Eq\((?:{name}, -?\d+|-?\d+, {name})\)")
        if (re.fullmatch(r"-?\d+", symbol.replaced_by or "") and any(fixed.search(g) for g in added)
                and not any(fixed.search(g) for g in made)):
            out.update({source: symbol.name for source in symbol.sources})
    return out


def as_handed(policy: ShapePolicy) -> ShapePolicy:
    """``policy`` as Dynamo handed the graph to the backend. The recorded policy is the compile's
    as it ended, and a replay that took it so compiled another program than the one Dynamo handed
    over (judged at backend entry, it said so):

    - a dimension the compile fixed to a number (``fixed_by_compile``) is its symbol again;
    - a dimension's range is the one the guards at entry render (``entry_range``): a
      ``mark_dynamic`` dimension's range is re-imposed as its constraint, and Inductor's bound
      (``<= 4096``) recorded as its range would be imposed on a backend that never makes it."""
    if policy.entry is None:
        return policy
    symbol_of = fixed_by_compile(policy)
    sources = _sources_by_expr(policy)

    def handed(dim):
        if dim.kind == "static":
            return dim
        if re.fullmatch(r"-?\d+", dim.expr or "") and dim.source in symbol_of:
            dim = dataclasses.replace(dim, expr=symbol_of[dim.source])
        low, high = entry_range(policy.entry.guards, sources.get(dim.expr, ()) or (dim.source,))
        if dim.size is not None and not ((low is None or low <= dim.size) and (high is None or dim.size <= high)):
            return dim  # guards at entry the recorded size breaks: not a range Dynamo could have had
        return dataclasses.replace(dim, min=low, max=high)

    return dataclasses.replace(policy, inputs=tuple(dataclasses.replace(r, dims=tuple(map(handed, r.dims)))
                                                    for r in policy.inputs))


def _sources_by_expr(policy: ShapePolicy) -> dict[str, tuple[str, ...]]:
    """Every source a symbolic expression was read from: the guards name a duck-sized symbol by
    one of them only."""
    out: dict[str, list[str]] = {}
    for r in policy.inputs:
        for dim in r.dims:
            if dim.expr and dim.source and dim.source not in out.setdefault(dim.expr, []):
                out[dim.expr].append(dim.source)
    for symbol in policy.symbols:
        for source in symbol.sources:
            if source not in out.setdefault(symbol.name, []):
                out[symbol.name].append(source)
    return {expr: tuple(found) for expr, found in out.items()}


def entry_range(guards: Sequence[str], sources: Sequence[str | None]) -> tuple[int | None, int | None]:
    """The range of a size read from ``sources`` as the rendered ``guards`` bound it
    (``2 <= L['x'].size()[0] and L['x'].size()[0] <= 100``): (None, None) where they do not.
    The sources are the archive's text: matched as text, never as a pattern of their own."""
    lows: list[int] = []
    highs: list[int] = []
    for source in filter(None, sources):
        name = re.escape(source)
        for text in guards:
            lows += [int(n) for n in re.findall(rf"(?:^|(?<=[\s(]))(-?\d+) <= {name}(?=$|[\s)])", text)]
            highs += [int(n) for n in re.findall(rf"{name} <= (-?\d+)(?=$|[\s)])", text)]
    return (max(lows) if lows else None), (min(highs) if highs else None)

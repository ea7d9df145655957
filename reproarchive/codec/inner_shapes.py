"""The recorded symbols of a graph's inner values: what a minifier candidate's new inputs are.

Why. A candidate cut from inside a graph takes inner values as inputs. In the recorded compile
such a value's size was a symbol of the graph's inputs (``x * 2`` of an ``x`` marked dynamic is
``[s77, 8]``); made static, the candidate compiled another program, and a bug that needs the
symbolic compile could not be cut past the ops before it. So the parent graph runs once on the
fake values of its recorded policy (``codec.shapes.fakes_for``), and each inner value's
dimension whose size is one of the inputs' recorded symbols is described as that input's
dimension is (its kind, origin and range). A size that is an expression of symbols (``s77 - 1``)
or a symbol the graph made itself (``u0`` of ``nonzero()``) stays static: a candidate's input
cannot carry that relation, and it is not passed off as if it did.
"""

from __future__ import annotations

import weakref
from typing import Any, Mapping

import torch

from reproarchive.codec.shape_guards import as_handed
from reproarchive.codec.shapes import fakes_for, is_symbolic, placeholder_names
from reproarchive.compat.fx_meta import fake_values
from reproarchive.format.schema import ShapeDim, ShapePolicy

#: parent graph -> its inner values' dimensions, made once per minify (every candidate asks)
_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: candidate graph -> the graph it was cut from, where that is not the archive's own (a graph
#: with a higher-order operator's subgraph inlined, whose inputs are the archive graph's)
_CUT_FROM: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_cut_from(candidate: Any, parent: Any) -> None:
    """Say that ``candidate`` was cut from ``parent`` (the minifier's ``Recording.build``)."""
    _CUT_FROM[candidate] = parent


def cut_from(candidate: Any, default: Any) -> Any:
    """The graph ``candidate`` was cut from (``note_cut_from``), else ``default``."""
    return _CUT_FROM.get(candidate, default)


def inner_dims(policy: ShapePolicy | None, gm: Any, args: list[Any], variant: Any = None,
               fed_by: Mapping[str, str] | None = None) -> Mapping[str, tuple[ShapeDim | None, ...]]:
    """Node name -> per dimension of its value, the recorded dimension whose symbol its size is
    (None: static), for ``gm``'s nodes whose values have such a dimension; empty without a
    symbolic ``policy`` or where the graph does not run on fake values (an op with no fake
    kernel): its candidates' cut inputs are then static, as before. With ``variant`` (a graph
    made from ``gm``: a job rank's graph that reads its collectives' values as inputs, a
    higher-order operator inlined), the variant's nodes are described: each of its placeholders
    is ``gm``'s of that name, or the value of ``gm``'s node ``fed_by`` names for it."""
    if policy is None or not is_symbolic(policy):
        return {}
    key = gm if variant is None else variant
    made = _MADE.get(key)
    if made is None or made[0] is not policy:
        try:
            made = (policy, _inner_dims(policy, gm, args, variant, fed_by or {}))
        except Exception:  # noqa: BLE001 - static cut inputs, as a graph without a policy has
            made = (policy, {})
        _MADE[key] = made
    return made[1]


def _inner_dims(policy: ShapePolicy, gm: Any, args: list[Any], variant: Any,
                fed_by: Mapping[str, str]) -> dict[str, tuple[ShapeDim | None, ...]]:
    names = placeholder_names(gm)
    shapes = fakes_for(policy, args, names)
    by_symbol: dict[Any, ShapeDim] = {}
    # each dimension as Dynamo handed it: a range Inductor's compile narrowed (``<= 4096``) is not a cut input's
    for rec in sorted(as_handed(policy).inputs, key=lambda r: r.kind != "tensor"):  # a tensor's dimension first
        fake = shapes.fakes[rec.input] if rec.input < len(shapes.fakes) else None
        sizes = fake.shape if isinstance(fake, torch.Tensor) else [fake]
        for dim, size in zip(rec.dims, sizes):
            symbol = _symbol(size, shapes.shape_env)
            if symbol is not None:
                by_symbol.setdefault(symbol, dim)
    fakes = [arg if fake is None else fake for arg, fake in zip(args, shapes.fakes)]
    values = fake_values(gm, shapes.fake_mode, fakes)
    if variant is not None:
        given = dict(zip(names, fakes))
        fed = {name: values[node] for name, node in fed_by.items() if node in values}
        values = {**fed, **fake_values(variant, shapes.fake_mode,
                                       [given[n] if n in given else fed[n] for n in placeholder_names(variant)])}
    out = {}
    for name, value in values.items():
        dims = tuple(by_symbol.get(_symbol(size, shapes.shape_env)) for size in value.shape)
        if any(d is not None for d in dims):
            out[name] = dims
    return out


def _symbol(size: Any, shape_env: Any) -> Any:
    if not isinstance(size, torch.SymInt):
        return None
    expr = shape_env.simplify(size.node.expr)
    return expr if expr.is_Symbol else None

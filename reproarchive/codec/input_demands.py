"""What a graph demands of the values of its integer inputs, for data generated in place of
absent ones (spec §6.2).

Generated integers in [0, 16) are fine for arithmetic but not for an input the graph uses as an
index: token ids fed to a 1000-row embedding stay in range by luck, position ids into an 8-row
table do not, and the replay then fails with an ``IndexError`` the program never had. So before
absent storages are filled, the graph is read for the inputs it uses as indices (embedding,
embedding_bag, index_select, gather, scatter, index_add/copy/fill, advanced indexing:
``aten.index.Tensor``, ``index_put``, ``x[idx]``, the class targets of ``nll_loss`` and
``cross_entropy``) and for the size of the dimension each one
indexes, and for the offsets of an ``embedding_bag`` (non-decreasing, from 0, at most the
number of indices). Masks need nothing: a bool input is generated as booleans anyway.

The reading is structural and conservative: an index counts when it is a graph input, reached
through ops that only reshape or copy it (view, unsqueeze, expand, clone, ``to``…), through
``where``, ``cat`` and ``stack``, or through integer arithmetic by a constant, whose inverse
moves the range (``emb(ids + 1)``: ``ids`` in [-1, n - 1)); the indexed
size comes from the input records, or from running the graph on ``meta`` tensors (shapes only,
no data) up to the first op that cannot run there. A demand that cannot be read is simply not
made; the data stays generated, and labelled so, either way.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from reproarchive.codec.graphs import GraphDecoder
from reproarchive.codec.tensors import FIDELITY_ABSENT, dtype_from_name
from reproarchive.compat.dispatch import OpOverload, OpOverloadPacket
from reproarchive.compat.fx_meta import val_of
from reproarchive.format.schema import SymValue, TensorValue


@dataclass(frozen=True)
class Demand:
    """``index``: every value in [low, high); ``offsets``: non-decreasing from 0, at most ``high``."""

    kind: str
    high: int
    low: int = 0

    def tighter(self, other: Demand | None) -> Demand:
        """Both demands (an index's ranges intersected); where they cannot both hold, this one."""
        if other is None:
            return self
        if other.kind != self.kind:
            return self if self.kind == "offsets" else other
        if self.kind == "offsets":
            return self if self.high <= other.high else other
        low, high = max(self.low, other.low), min(self.high, other.high)
        return Demand("index", high, low) if low < high else self


# op name -> (position of the indexed tensor, position of the index, where the dim is):
# an int is the dim itself, "arg:N" the position of the dim argument.
_ATEN_INDEXING: dict[str, tuple[int, int, Any]] = {
    "embedding": (0, 1, 0),
    "_embedding_bag": (0, 1, 0),
    "_embedding_bag_forward_only": (0, 1, 0),
    "embedding_bag": (0, 1, 0),
    "index_select": (0, 2, "arg:1"),
    "gather": (0, 2, "arg:1"),
    "scatter": (0, 2, "arg:1"),
    "scatter_": (0, 2, "arg:1"),
    "scatter_add": (0, 2, "arg:1"),
    "scatter_add_": (0, 2, "arg:1"),
    "scatter_reduce": (0, 2, "arg:1"),
    "scatter_reduce_": (0, 2, "arg:1"),
    "index_add": (0, 2, "arg:1"),
    "index_add_": (0, 2, "arg:1"),
    "index_copy": (0, 2, "arg:1"),
    "index_copy_": (0, 2, "arg:1"),
    "index_fill": (0, 2, "arg:1"),
    "index_fill_": (0, 2, "arg:1"),
}
# class targets of a loss index the class dimension: dim 1, or 0 for an unbatched input
for _loss in ("nll_loss", "nll_loss_forward", "nll_loss2d", "nll_loss2d_forward", "nll_loss_nd"):
    _ATEN_INDEXING[_loss] = (0, 1, "class")
_ATEN_INDEXING["nll_loss_backward"] = _ATEN_INDEXING["nll_loss2d_backward"] = (1, 2, "class")
# torch.nn.functional's own argument order differs from aten's
_FUNCTIONAL_INDEXING = {"embedding": (1, 0, 0), "embedding_bag": (1, 0, 0), "nll_loss": (0, 1, "class"),
                        "cross_entropy": (0, 1, "class")}
# aten/torch ops whose first argument is a list of index tensors, one per leading dim
_INDEX_LISTS = {"index", "_unsafe_index", "index_put", "index_put_", "_unsafe_index_put", "_index_put_impl_"}
# ops that keep an index's values (they only reshape, copy or re-type it)
_PASS_THROUGH = {
    "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "expand_as", "permute", "t",
    "transpose", "clone", "contiguous", "flatten", "select", "slice", "alias", "detach", "to", "_to_copy",
    "long", "int", "view_as", "unflatten", "narrow", "repeat", "broadcast_to", "convert_element_type",
    "lift_fresh_copy",
}
_OFFSETS_OPS = {"_embedding_bag", "_embedding_bag_forward_only", "embedding_bag"}


def _op_name(node: fx.Node) -> str | None:
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, OpOverload):
        return target.overloadpacket.__name__
    if isinstance(target, OpOverloadPacket):
        return target.__name__
    return getattr(target, "__name__", None)


def _is_functional(node: fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__module__", "") == "torch.nn.functional"


def _arg(node: fx.Node, position: int, name: str | None = None) -> Any:
    if position < len(node.args):
        return node.args[position]
    return node.kwargs.get(name) if name else None


def _source_input(value: Any, positions: dict[fx.Node, int], depth: int = 0) -> int | None:
    """The graph input ``value`` is, through ops that keep its values (and through either
    branch of a ``where``, as a decomposed ``nll_loss`` masks its ignored targets); None if it
    is not one."""
    if not isinstance(value, fx.Node) or depth > 64:
        return None
    if value in positions:
        return positions[value]
    name = _op_name(value)
    if name == "where" and len(value.args) == 3:
        found = (_source_input(branch, positions, depth + 1) for branch in value.args[1:])
        return next((i for i in found if i is not None), None)
    if name not in _PASS_THROUGH or not value.args:
        return None
    return _source_input(value.args[0], positions, depth + 1)


def _sources(value: Any, positions: dict[fx.Node, int], low: int, high: int,
             depth: int = 0) -> list[tuple[int, int, int]]:
    """(graph input, low, high) for each input whose values reach ``value``, with the range
    [low, high) its values must be in for ``value``'s to be in [low, high) here: through ops that
    keep the values, either branch of a ``where``, each tensor of a ``cat`` or ``stack``, and
    integer arithmetic by a constant (``ids + 1`` must be in [0, n): ``ids`` in [-1, n - 1)).
    A ``clamp`` into the range satisfies it whatever its input; an empty range is no demand."""
    if not isinstance(value, fx.Node) or depth > 64 or low >= high:
        return []
    if value in positions:
        return [(positions[value], low, high)]
    name = _op_name(value)
    args = value.args
    if name == "where" and len(args) == 3:
        return [s for branch in args[1:] for s in _sources(branch, positions, low, high, depth + 1)]
    if name in ("cat", "stack", "concat", "concatenate") and args and isinstance(args[0], (list, tuple)):
        return [s for part in args[0] for s in _sources(part, positions, low, high, depth + 1)]
    if name in _ARITHMETIC and len(args) >= 2:
        return _through_arithmetic(value, name, positions, low, high, depth)
    if name in _CLAMPS and args:
        bounds = _clamp_bounds(value, name)
        if bounds is not None and low <= bounds[0] and bounds[1] < high:
            return []  # whatever goes in comes out in range
        return _sources(args[0], positions, low, high, depth + 1)
    if name not in _PASS_THROUGH or not args:
        return []
    return _sources(args[0], positions, low, high, depth + 1)


#: integer arithmetic by a constant whose inverse keeps a range a range
_ADDS = {"add", "__add__", "__radd__", "add_"}
_SUBS = {"sub", "__sub__", "sub_", "subtract"}
_MULS = {"mul", "__mul__", "__rmul__", "mul_", "multiply"}
_ARITHMETIC = _ADDS | _SUBS | _MULS
_CLAMPS = {"clamp", "clip", "clamp_", "clip_", "clamp_min", "clamp_max"}


def _constant_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _through_arithmetic(node: fx.Node, name: str, positions: dict[fx.Node, int], low: int, high: int,
                        depth: int) -> list[tuple[int, int, int]]:
    first, second = node.args[0], node.args[1]
    tensor, constant = (first, _constant_int(second)) if isinstance(first, fx.Node) else \
        (second, _constant_int(first))
    if not isinstance(tensor, fx.Node) or constant is None:
        return []
    if name in _SUBS and tensor is not first:
        return []  # c - x: a reflected range, not followed
    alpha = _constant_int(node.kwargs.get("alpha", 1))
    if alpha is None:
        return []
    if name in _ADDS:
        low, high = low - constant * alpha, high - constant * alpha
    elif name in _SUBS:
        low, high = low + constant * alpha, high + constant * alpha
    else:  # x * c, c > 0: x in [ceil(low / c), floor((high - 1) / c) + 1)
        if constant <= 0:
            return []
        low, high = -(-low // constant), (high - 1) // constant + 1
    return _sources(tensor, positions, low, high, depth + 1)


def _clamp_bounds(node: fx.Node, name: str) -> tuple[int, int] | None:
    """The [min, max] a clamp keeps its values in, where both are integer constants."""
    args = list(node.args[1:3])
    lo = node.kwargs.get("min", args[0] if args else None)
    hi = node.kwargs.get("max", args[1] if len(args) > 1 else None)
    if name == "clamp_min":
        lo, hi = (args[0] if args else node.kwargs.get("min")), None
    elif name == "clamp_max":
        lo, hi = None, (args[0] if args else node.kwargs.get("max"))
    lo, hi = _constant_int(lo), _constant_int(hi)
    return (lo, hi) if lo is not None and hi is not None else None


class _Shapes:
    """Shapes of graph values: the input records first, else one run of the graph on meta
    tensors (no data), done lazily and stopped at the first op that cannot run there."""

    def __init__(self, gm: fx.GraphModule, inputs: Sequence[Any]):
        self.gm, self.inputs = gm, inputs
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._ran: dict[fx.Node, Any] | None = None

    def shape(self, node: Any) -> tuple[int, ...] | None:
        if not isinstance(node, fx.Node):
            return None
        val = val_of(node)
        if isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape):
            return tuple(val.shape)
        if node in self.placeholders:
            rec = self._record(self.placeholders.index(node))
            return tuple(rec.shape) if isinstance(rec, TensorValue) else None
        if self._ran is None:
            self._ran = self._run()
        out = self._ran.get(node)
        return tuple(out.shape) if isinstance(out, torch.Tensor) else None

    def _record(self, i: int) -> Any:
        return self.inputs[i] if i < len(self.inputs) else None

    def _meta_inputs(self) -> list[Any]:
        out = []
        for i in range(len(self.placeholders)):
            rec = self._record(i)
            if isinstance(rec, TensorValue):
                out.append(torch.empty_strided(rec.shape, rec.stride, dtype=dtype_from_name(rec.dtype), device="meta"))
            elif isinstance(rec, SymValue):
                out.append(rec.hint)
            else:
                out.append(getattr(rec, "value", None))
        return out

    def _run(self) -> dict[fx.Node, Any]:
        seen: dict[fx.Node, Any] = {}

        class Recorder(fx.Interpreter):
            """Everything on ``meta``: the graph's own tensors and the devices it names too."""

            def run_node(self, n: fx.Node) -> Any:
                result = super().run_node(n)
                seen[n] = result
                return result

            def get_attr(self, target, args, kwargs):
                value = super().get_attr(target, args, kwargs)
                return value.to("meta") if isinstance(value, torch.Tensor) else value

            def call_function(self, target, args, kwargs):
                if "device" in kwargs:
                    kwargs = {**kwargs, "device": "meta"}
                # a device passed by position too (Inductor's ``inductor_seeds(1, device)``)
                args = tuple(torch.device("meta") if isinstance(a, torch.device) else a for a in args)
                return super().call_function(target, args, kwargs)

        with contextlib.suppress(Exception), torch.no_grad():
            # data-dependent or meta-less ops end the run: the shapes known so far stay
            Recorder(self.gm).run(*self._meta_inputs())
        return seen


def input_demands(gm: fx.GraphModule, inputs: Sequence[Any]) -> dict[int, Demand]:
    """Input position -> what the graph demands of its values, for the inputs it uses as
    indices or offsets. ``inputs`` are the input records (or anything with ``shape``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positions = {n: i for i, n in enumerate(placeholders)}
    shapes = _Shapes(gm, inputs)
    found: dict[int, Demand] = {}

    def demand(index: Any, indexed: Any, dim: Any) -> None:
        if not isinstance(dim, int):
            return
        shape = shapes.shape(indexed)
        if shape is None or not -len(shape) <= dim < len(shape) or shape[dim] <= 0:
            return
        for i, low, high in _sources(index, positions, 0, shape[dim]):
            found[i] = Demand("index", high, low).tighter(found.get(i))

    for node in gm.graph.nodes:
        name = _op_name(node)
        if name is None:
            continue
        if name in _INDEX_LISTS and len(node.args) >= 2 and isinstance(node.args[1], (list, tuple)):
            for dim, index in enumerate(node.args[1]):
                demand(index, node.args[0], dim)
        elif name == "getitem" and node.target is operator.getitem and len(node.args) == 2:
            _getitem_demands(node, demand)
        spec = _FUNCTIONAL_INDEXING.get(name) if _is_functional(node) else _ATEN_INDEXING.get(name)
        if spec is None:
            continue
        indexed_at, index_at, dim = spec
        indexed = _arg(node, indexed_at, "weight" if name.startswith("embedding") else None)
        index = _arg(node, index_at, _index_keyword(name, _is_functional(node)))
        if dim == "class":
            shape = shapes.shape(indexed)
            dim = None if shape is None else int(len(shape) >= 2)
        elif isinstance(dim, str):
            dim = _arg(node, int(dim.split(":")[1]), "dim")
        demand(index, indexed, dim)
        if name in _OFFSETS_OPS:
            offsets = _arg(node, 2, "offsets")
            i = _source_input(offsets, positions)
            count = shapes.shape(index)
            if i is not None and count is not None and len(count) == 1:
                found[i] = Demand("offsets", count[0]).tighter(found.get(i))
    return found


def _index_keyword(name: str, functional: bool) -> str:
    """What the index argument is called when it is passed by keyword."""
    if "embedding" in name:
        return "input" if functional else "indices"
    return "target" if "loss" in name or name == "cross_entropy" else "index"


def _getitem_demands(node: fx.Node, demand) -> None:
    """``x[idx]`` and ``x[a, :, idx]`` in a Dynamo graph: each tensor index indexes the dim it
    stands at (a slice or int takes one dim, None none; after an Ellipsis dims are unknown)."""
    base, key = node.args
    items = key if isinstance(key, tuple) else (key,)
    dim = 0
    for item in items:
        if item is Ellipsis:
            return
        if item is None:
            continue
        if isinstance(item, fx.Node):
            demand(item, base, dim)
        dim += 1


def storage_demands(inputs: Sequence[Any], storages: Sequence[Any], graph: Any) -> dict[int, Demand]:
    """Storage position -> demand, for the absent integer storages among ``inputs`` (value
    records over the storage table ``storages``) that the graph uses as indices or offsets.
    ``graph`` is the GraphModule, or its graph record, then rebuilt over ``meta`` tensors
    (shapes only). Costs nothing when no input is an absent integer tensor."""

    wanted: dict[int, int] = {}
    for i, rec in enumerate(inputs):
        if isinstance(rec, TensorValue) and storages[rec.storage].fidelity == FIDELITY_ABSENT:
            dtype = dtype_from_name(rec.dtype)
            if not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool:
                wanted[i] = rec.storage
    if not wanted:
        return {}
    if not isinstance(graph, fx.GraphModule):
        def meta(rec: TensorValue) -> torch.Tensor:
            return torch.empty_strided(rec.shape, rec.stride, dtype=dtype_from_name(rec.dtype), device="meta")

        graph = GraphDecoder(meta).decode(graph)
    out: dict[int, Demand] = {}
    for i, d in input_demands(graph, inputs).items():
        if i in wanted:
            out[wanted[i]] = d.tighter(out.get(wanted[i]))
    return out

"""The one graph representation every minifier move works on: a kept node set over the original.

PyTorch's minifier edits deep copies of FX graphs in place, so a move can produce a graph that
no longer lints, and two moves that reach the same graph cannot tell they did. Here the original
graph is recorded once (its eager value at every node) and every candidate is *described* by
the set of original op nodes it keeps plus a substitution map (bypassed node -> the node whose
value replaces it). Everything else follows by construction:

* a kept node whose argument is not kept reads that argument's recorded eager value through a
  new graph input ("cut"), whatever the value is: tensor, int, float, bool or a SymInt
  concretised to its hint;
* outputs are the kept nodes nobody kept reads (the frontier), so removing a node "hoists" the
  output to its arguments and any node can become an output; a kept node whose value the
  original graph returns stays an output even when a kept node reads it (an AOT forward returns
  the activations its backward saves: an accuracy judge may see an error only there, and
  dropping that output silently changes what every candidate is judged on; see passes.py);
* dead code and unused inputs never appear, because only what the outputs and the side-effecting
  nodes need is emitted;
* values that cannot be graph inputs (tuples from ``split``/``max.dim``, opaque objects) are never
  cut: the node that produces them is kept instead, and a kept tuple node with no kept ``getitem``
  outputs its tensor items;
* an in-place node that a kept later reader of its mutated argument depends on is kept, so
  removing a mutation never silently changes what the remaining graph computes.

Because the description determines the graph, the description (in normal form) plus the input
metadata is the memo key: no graph is judged twice.
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch.fx.node import map_arg

from reproarchive.codec.inner_shapes import note_cut_from
from reproarchive.codec.tensors import nested_int_key, nested_int_owner
from reproarchive.compat.fake import is_fake_tensor, new_fake_mode, new_shape_env
from reproarchive.compat.fx_meta import forget_values
from reproarchive.compat.tensor_internals import is_traceable_wrapper_subclass
from reproarchive.compat.thread_state import is_functorch_wrapped_tensor
from reproarchive.errors import EagerRunError
from reproarchive.format.schema import COMPUTE_OPS

from . import inputs as _inputs
from . import normal_form as _nf
from .inputs import IDENTITY, Transform

_SCALARS = (int, float, bool, type(None), str, torch.dtype, torch.device, torch.memory_format, torch.layout)
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class _Uncuttable:
    """Marks a recorded value that cannot be handed to a graph as an input."""


UNCUTTABLE = _Uncuttable()


def concrete_scalar(value: Any) -> Any:
    """A SymInt/SymFloat/SymBool as the plain Python value it had in this run (its hint)."""
    if not isinstance(value, _SYMBOLIC):
        return value
    hint = getattr(value.node, "hint", None)
    if hint is not None:
        return hint
    kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)]
    return kind(value)  # may guard; raises for unbacked symbols, which the caller catches


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense in some dimension order (so empty_strided can hold it)."""
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda p: p[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def snapshot_tensor(t: torch.Tensor, *, keep_leafness: bool = False) -> torch.Tensor:
    """A private copy with the same sizes, strides, storage offset, dtype and device.

    Strides matter: many compiler bugs only happen on a transposed or sliced input, and an
    intermediate turned into an input must look exactly like it did in eager. The copy is
    detached from the original (candidates never share autograd history or storage); it requires
    grad when the original did, so backward-stage failures still reproduce. With ``keep_leafness`` (the
    graph's own inputs, and every copy an oracle call gets) it is a non-leaf when the original
    was one (a view with a history of its own, as ``load`` rebuilds a recorded non-leaf): the
    original is judged on the inputs ``run`` hands the compiler, or the two could disagree
    (``non_leaf_compile_error_TESTING_ONLY`` fails only on a non-leaf). An intermediate value
    cut into an input is a leaf.
    """
    with torch.no_grad():
        base = t.detach()
        try:
            if _dense(base):
                out = torch.empty_strided(base.size(), base.stride(), dtype=base.dtype, device=base.device)
                out.copy_(base)
            else:  # expanded/overlapping or sparse views: copy the storage, keep the geometry
                storage = base.untyped_storage().clone()
                out = torch.empty((0,), dtype=base.dtype, device=base.device)
                out.set_(storage, base.storage_offset(), base.size(), base.stride())
        except Exception:  # subclasses, quantized, meta...: a plain clone is the best we can do
            out = base.clone()
    if t.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
        if keep_leafness and not t.is_leaf:
            out = out.view_as(out)
    return out


def fresh_copy(value: Any) -> Any:
    """What one oracle call receives, so a candidate that mutates its inputs corrupts nothing."""
    if isinstance(value, torch.Tensor):
        return snapshot_tensor(value, keep_leafness=True)
    if isinstance(value, (list, tuple)):
        return type(value)(fresh_copy(v) for v in value)
    return value


def _record_value(value: Any, *, keep_leafness: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        if is_functorch_wrapped_tensor(value):
            return UNCUTTABLE  # a value inside a vmap region Dynamo inlined (flex_attention's block mask)
        return snapshot_tensor(value, keep_leafness=keep_leafness)
    if isinstance(value, _SYMBOLIC):
        try:
            return concrete_scalar(value)
        except Exception:
            return UNCUTTABLE
    if isinstance(value, _SCALARS):
        return value
    return UNCUTTABLE


def _meta_key(value: Any) -> Any:
    """Input metadata for the memo key: layout for tensors, the value itself for scalars."""
    if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):  # its size j1 is no int
        return ("C", type(value).__name__, str(value.shape), tuple(_meta_key(getattr(value, a))
                                                                 for a in value.__tensor_flatten__()[0]))
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), tuple(value.stride()), value.storage_offset(), str(value.dtype),
                str(value.device), value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__,) + tuple(_meta_key(v) for v in value)
    try:
        hash(value)
        return ("S", type(value).__name__, value)
    except TypeError:
        return ("O", type(value).__name__, id(value))


def _mutated_arg(node: fx.Node) -> fx.Node | None:
    """The argument an in-place/out= node writes to, if we can tell."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is not None:
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
                if isinstance(value, fx.Node):
                    return value
        return None
    first = node.args[0] if node.args else None
    return first if isinstance(first, fx.Node) else None


def _is_inplace_name(name: str) -> bool:
    return name.endswith("_") and not name.endswith("__")


def _effectful(node: fx.Node) -> bool:
    """Side effects that dead-code elimination and cutting must respect."""
    if node.op == "call_method":
        return _is_inplace_name(str(node.target))
    if node.op == "call_function":
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return True
        if schema is None and _is_inplace_name(getattr(node.target, "__name__", "")):
            return True
    try:
        # Random ops are not effects here: a cut random op holds its recorded (deterministic) value.
        return node.is_impure(impure_random=False)
    except TypeError:  # older torch without the keyword
        return node.is_impure()
    except Exception:
        return False


class _RecordingInterpreter(fx.Interpreter):
    """Runs the original graph once and keeps a private copy of every node's value.

    Copies are taken as each node runs, so a value later mutated in place is recorded as it was
    when produced, and no candidate can see another candidate's writes.
    """

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm, garbage_collect_values=True)
        self.values: dict[fx.Node, Any] = {}
        self.tuples: set[fx.Node] = set()

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n.op != "output":
            self.values[n] = _record_value(result, keep_leafness=n.op == "placeholder")
            if isinstance(result, (tuple, list)):
                self.tuples.add(n)
        return result


def _recorded_run(gm: fx.GraphModule, example_inputs: list[Any]) -> _RecordingInterpreter:
    """One eager run that keeps every value; a graph that cannot run is the caller's to fix."""
    interp = _RecordingInterpreter(gm)
    # Record under no_grad unless an input wants grad: then intermediates keep the flag.
    wants_grad = any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
    try:
        with contextlib.nullcontext() if wants_grad else torch.no_grad():
            if any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in example_inputs):
                _shapes_only_run(interp, example_inputs)
            else:
                interp.run(*[fresh_copy(x) for x in example_inputs])
    except Exception as exc:
        raise EagerRunError(
            f"the graph does not run eagerly with these inputs ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''})",
            "the minifier needs every intermediate value of one eager run; check the inputs and device",
        ) from exc
    return interp


def _shapes_only_run(interp: _RecordingInterpreter, example_inputs: list[Any]) -> None:
    """The recording run of inputs that hold shapes and no data (``meta``: a compile-only
    replay's, for a device this machine lacks): on fake tensors made from them, so that an op
    that reads a value (a ``cond``'s predicate) takes every branch, as a compile does, and a
    value read (``.item()``) is a symbol, which cannot be cut. Each value is kept as a ``meta``
    tensor of its geometry, as the inputs are."""
    mode = new_fake_mode(new_shape_env())
    with mode:
        interp.run(*[mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x
                     for x in example_inputs])
    interp.values = {n: _as_meta(v) for n, v in interp.values.items()}


def _as_meta(value: Any) -> Any:
    if is_fake_tensor(value):
        out = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="meta")
        return out.requires_grad_(True) if value.requires_grad else out
    return value


@dataclass(frozen=True)
class Candidate:
    """One graph in normal form: which original nodes it computes, reads as inputs, and outputs,
    and how its inputs differ from the recorded values (input moves)."""

    live: tuple[int, ...]          # original op-node indices computed, in topological order
    outputs: tuple[int, ...]       # original indices whose values the graph returns
    inputs: tuple[int, ...]        # original indices whose (recorded or given) values are inputs
    redirects: tuple[tuple[int, int], ...]  # (bypassed node, node read instead) among live edges
    key: Any = field(compare=False, repr=False)
    xforms: tuple[tuple[int, Transform], ...] = ()  # (input index, transform), identity omitted
    input_cost: tuple[int, int] = (0, 0)  # (bytes of tensor inputs, recorded-data weight)

    @property
    def size(self) -> tuple[int, ...]:
        """Order in which candidates count as smaller: op nodes, inputs, outputs, then input
        bytes, then how much recorded data the inputs hold (zeros < ones < recorded)."""
        return (len(self.live), len(self.inputs), len(self.outputs)) + self.input_cost

    @property
    def transforms(self) -> dict[int, Transform]:
        return dict(self.xforms)


class Recording:
    """The original graph, indexed, with the eager value of every node."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]):
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.nodes: list[fx.Node] = list(gm.graph.nodes)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.example_inputs):
            raise ValueError(f"the graph has {len(placeholders)} inputs but {len(self.example_inputs)} "
                             "example inputs were given")
        self.input_position = {self.index[n]: i for i, n in enumerate(placeholders)}

        interp = _recorded_run(gm, self.example_inputs)
        values = interp.values

        n = len(self.nodes)
        self.is_op = [node.op in COMPUTE_OPS for node in self.nodes]
        self._index_edges()
        self.value: list[Any] = [values.get(node, UNCUTTABLE) for node in self.nodes]
        for i, pos in self.input_position.items():
            self.value[i] = self.example_inputs[pos]
        self.is_tensor = [isinstance(v, torch.Tensor) for v in self.value]
        self.cuttable = [self.is_op[i] and self.value[i] is not UNCUTTABLE for i in range(n)]
        self.is_tuple = [node in interp.tuples for node in self.nodes]
        self._index_items_and_effects()
        self.meta_key = [_meta_key(v) if v is not UNCUTTABLE else None for v in self.value]
        self.tensor_meta = [
            (tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor) else None for v in self.value
        ]
        self.ops: tuple[int, ...] = tuple(i for i in range(n) if self.is_op[i])
        output_node = self.nodes[-1]
        flat: list[int] = []
        if output_node.op == "output":
            map_arg(output_node.args, lambda a: flat.append(self.index[a]) or a)
        self.original_outputs = tuple(i for i in dict.fromkeys(flat) if self.is_op[i])
        # nested ints (a nested jagged tensor's ragged size, j1) among the values: each is stored
        # as the size of an input tensor that has it, so a candidate must keep one (``stores``)
        self.nested = {i: key for i, key in enumerate(map(nested_int_key, self.value)) if key is not None}
        costs = [_inputs.cost(v, IDENTITY) for v in self.example_inputs]
        self.original_size = (
            len(self.ops), len(placeholders), len(flat), sum(c[0] for c in costs), sum(c[1] for c in costs),
        )

    def _index_edges(self) -> None:
        """Each node's distinct argument nodes and its readers, so the moves never walk fx's
        arguments (nested lists, kwargs) again."""
        self.args: list[tuple[int, ...]] = []
        self.users: list[list[int]] = [[] for _ in range(len(self.nodes))]
        for i, node in enumerate(self.nodes):
            seen: list[int] = []
            map_arg((node.args, node.kwargs), lambda a, seen=seen: seen.append(self.index[a]) or a)
            deps = tuple(dict.fromkeys(seen))
            self.args.append(deps)
            for d in deps:
                self.users[d].append(i)

    def _index_items_and_effects(self) -> None:
        """Which nodes take an item of a recorded tuple, and which write to which argument: the
        rules that keep tuples and mutations read them on every candidate."""
        n = len(self.nodes)
        self.getitem_source: list[int | None] = [None] * n
        for i, node in enumerate(self.nodes):
            if (node.op == "call_function" and node.target is operator.getitem
                    and isinstance(node.args[0], fx.Node) and self.is_tuple[self.index[node.args[0]]]):
                self.getitem_source[i] = self.index[node.args[0]]
        self.effectful = [self.is_op[i] and _effectful(node) for i, node in enumerate(self.nodes)]
        self.mutates: dict[int, int] = {}
        for i, node in enumerate(self.nodes):
            if self.effectful[i]:
                target = _mutated_arg(node)
                if target is not None:
                    self.mutates[i] = self.index[target]

    # -- normal form -------------------------------------------------------------------------

    def normalise(self, keep: Sequence[int] | frozenset[int], subst: dict[int, int] | None = None,
                  outputs: Sequence[int] | None = None, xforms: dict[int, Transform] | None = None) -> Candidate:
        """The candidate that keeps ``keep`` (minus bypassed nodes), closed under the rules above;
        ``xforms`` transforms inputs (kept only for nodes that are still inputs)."""
        subst = subst or {}
        xforms = xforms or {}
        res = _nf.resolver(subst)
        S = _nf.kept_ops(self, keep, subst, res)
        outs = [o for o in outputs if o in S] if outputs is not None else _nf.frontier(self, S, subst, res)
        roots = set(outs) | {v for v in S if self.effectful[v]}
        live = _nf.live_nodes(self, S, roots, subst, res)
        return Candidate(*_nf.normal_fields(self, live, outs, xforms, res))

    def stores(self, cand: Candidate) -> bool:
        """Whether ``cand``'s inputs can be stored: every nested int among them is the size or
        stride of one of its tensor inputs (dropping a nested jagged tensor drops its size with
        it; a candidate that keeps the size alone is never judged)."""
        orphans = [self.nested[i] for i in cand.inputs if i in self.nested]
        if not orphans:
            return True
        tensors = [self.value[i] for i in cand.inputs if self.is_tensor[i]]
        return all(nested_int_owner(tensors, key) is not None for key in orphans)

    def start(self) -> Candidate:
        """The original graph in normal form (same outputs, no dead code, no unused inputs)."""
        return self.normalise(self.ops, outputs=self.original_outputs)

    # -- materialise ---------------------------------------------------------------------------

    def input_origins(self, cand: Candidate) -> list[str]:
        """Where each input of ``cand`` comes from: ``input:<position>`` or ``node:<name>``."""
        return [f"input:{self.input_position[i]}" if i in self.input_position else f"node:{self.nodes[i].name}"
                for i in cand.inputs]

    def input_provenance(self, cand: Candidate) -> list[dict[str, Any]]:
        """Per input of ``cand``: its origin, the original inputs its value was computed from
        (``depends_on``, positions in ``example_inputs``), and how an input move changed it
        (``values``: recorded, cropped, cast, zeros or ones; ``shape``/``dtype`` from -> to)."""
        tx = cand.transforms
        origins = self.input_origins(cand)
        return [{"origin": origin, "depends_on": self.depends_on(i),
                 **_inputs.label(self.value[i], tx.get(i, IDENTITY))}
                for origin, i in zip(origins, cand.inputs)]

    def depends_on(self, i: int) -> list[int]:
        """Positions of the original inputs whose values node ``i``'s recorded value depends on."""
        seen, stack, found = set(), [i], set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.input_position:
                found.add(self.input_position[v])
            stack.extend(self.args[v])
        return sorted(found)

    def build(self, cand: Candidate) -> tuple[fx.GraphModule, list[Any]]:
        """The GraphModule and the input values (the caller's own objects, not copies, except
        transformed inputs, which are new tensors)."""
        subst = dict(cand.redirects)
        tx = cand.transforms
        graph = fx.Graph()
        env: dict[int, fx.Node] = {}
        inputs: list[Any] = []
        for i in cand.inputs:
            src = self.nodes[i]
            ph = graph.placeholder(src.name, type_expr=src.type if src.op == "placeholder" else None)
            ph.meta = dict(src.meta)
            env[i] = ph
            if i in tx:
                # the recorded meta describes the recorded value, not this one
                forget_values(ph)
                inputs.append(_inputs.apply(self.value[i], tx[i]))
            else:
                inputs.append(self.value[i])

        def lookup(a: fx.Node) -> fx.Node:
            i = self.index[a]
            i = subst.get(i, i)
            if i not in env:  # only get_attr can be missing: it is free, not an input
                env[i] = graph.node_copy(self.nodes[i])
            return env[i]

        for i in cand.live:
            env[i] = graph.node_copy(self.nodes[i], lookup)
        graph.output(tuple(env[o] for o in cand.outputs))
        gm = fx.GraphModule(self.gm, graph)
        note_cut_from(gm, self.gm)  # its cut inputs' symbols are read from the graph it was cut from
        return gm, inputs

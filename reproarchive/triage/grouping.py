"""Which archives hold the same bug: a signature in levels, computed from the index alone.

A fleet of failures is a few bugs many times over, each copy from another model, shape or
machine. PyTorch's CI groups log lines by regular expression and misfires when a pattern is too
generic; the archive's own failure signature (``context.failure.signature``: stage, exception
type, normalised message, the compiler's first diagnostic) is better, but it still keys on FX's
node names (``sigmoid`` and ``sigmoid_1`` are different words) and it cannot tell two failures
whose message says nothing (``ReluCompileError()``) or says the same of different ops.

So the signature here has levels, each read from the decoded index (no replay, no blob read):

1. ``stage`` and ``exception_type`` (a fault on the device: ``run``, ``device fault``, and its
   class as the message, ``context.failure_signature.device_fault``);
2. ``message``: the first line of the innermost message with the graph's own names replaced by
   what they stand for (a node name by its op, an input by ``<input>``), then masked as the
   failure signature masks it (paths, addresses, numbers); ``diagnostic``: the compiler's first
   error line, likewise;
3. ``target``: the target of the node that failed, when the failure names one (a node name or
   an ``aten`` target in the message, or the line of the generated ``forward`` the traceback
   stopped in);
4. ``structure``: a hash of the graph near that node (two hops of ops, names and shapes left
   out), or of the graph's op multiset when no node is named.

Archives are grouped on levels 1-3 (``LEVELS``: ``--by node``, the default); ``--by failure``
stops at level 2, ``--by structure`` adds level 4 (one bug in several models then splits by
model). Within a group the structure hashes are reported as variants.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from reproarchive.context.failure import DIAGNOSTIC_MARK, compiler_errors, device_fault, normalise_message
from reproarchive.format.plain import PlainRecord
from reproarchive.format.schema import (
    COMPUTE_OPS,
    DictArg,
    GraphRecord,
    Index,
    ModuleEntry,
    NodeRef,
    SliceArg,
    TupleArg,
)

#: How deep ``group`` keys: each level adds fields of ``Signature`` to the group key.
LEVELS = {
    "failure": ("stage", "exception_type", "message", "diagnostic"),
    "node": ("stage", "exception_type", "message", "diagnostic", "target"),
    "structure": ("stage", "exception_type", "message", "diagnostic", "target", "structure"),
}
DEFAULT_LEVEL = "node"
NO_FAILURE = "(no failure recorded)"
_HOPS = 2

# inductor's LoweringException and friends: "target: aten.add.Tensor"
_ATEN_TARGET = re.compile(r"\btarget: (aten\.[\w.]+)")
# a frame of FX's generated forward: File "<eval_with_key>.3", line 7, in forward\n    relu = ...
_FX_FRAME = re.compile(r'File "<eval_with_key>[^"]*", line \d+, in \w+\n\s+([A-Za-z_]\w*) = ')


@dataclasses.dataclass(frozen=True)
class Signature(PlainRecord):
    """The levels of one archive's failure signature (module docstring); every field is
    normalised, so equal fields mean the same thing whichever machine recorded the archive."""

    stage: str
    exception_type: str
    message: str
    diagnostic: str
    target: str | None  # the failing node's target, when the failure names a node
    structure: str  # sha256 (16 hex) of the graph near the failing node, or of its op multiset
    located_by: str | None = None  # how the failing node was found: message, aten_target, traceback

    def key(self, level: str = DEFAULT_LEVEL) -> tuple:
        return tuple(getattr(self, name) for name in LEVELS[level])

    def text(self) -> str:
        """One line: ``stage|type|message[|diag:...][ @target]``."""
        base = f"{self.stage}|{self.exception_type}|{self.message}"
        if self.diagnostic:
            base += f"|diag:{self.diagnostic}"
        return base + (f" @{self.target}" if self.target else "")


def signature_of(index: Index) -> Signature | None:
    """The signature of the failure ``index`` records; None when it records none."""
    f = index.records.failure
    if f is None:
        return None
    graph = index.graph
    names = _name_meanings(graph)
    first = next((ln.strip() for ln in f.message.splitlines() if ln.strip()), "")
    diagnostics = compiler_errors(f.message)
    node, located_by = failing_node(index)
    target = _meaning(graph, node) if node is not None else None
    # what the failure's own signature leaves out (an accuracy report's figures, a crash's last
    # words) stays out here too
    says_message = f.signature.split(DIAGNOSTIC_MARK)[0].split("|", 2)[-1] != ""
    fault = device_fault(f.signature)
    if fault is not None:  # one fault under several codes, types and stages: grouped by its class
        return Signature(stage="run", exception_type="device fault", message=fault, diagnostic="", target=target,
                         structure=structure_hash(graph, node), located_by=located_by)
    return Signature(stage=f.stage, exception_type=f.exception_type,
                     message=normalise_message(_replace_names(first, names)) if says_message else "",
                     diagnostic=normalise_message(_replace_names(diagnostics[0], names)) if diagnostics else "",
                     target=target, structure=structure_hash(graph, node), located_by=located_by)


# --------------------------------------------------------------------------------------------
# the failing node


def failing_node(index: Index) -> tuple[Any, str | None]:
    """(the node the failure names, how it was found), or (None, None).

    In order: a compute node whose name the message's first line says as a word; a node whose
    ``aten`` target the message or traceback names (``target: aten.relu.default``); the node
    the innermost frame of FX's generated ``forward`` assigns (a runtime error's traceback)."""
    f = index.records.failure
    compute = [n for n in index.graph.nodes if n.op in COMPUTE_OPS]
    by_name = {n.name: n for n in compute}
    first = next((ln for ln in f.message.splitlines() if ln.strip()), "")
    for word in re.findall(r"[A-Za-z_]\w*", first):
        if word in by_name:
            return by_name[word], "message"
    for text in (f.message, f.traceback):
        named = _ATEN_TARGET.findall(text)
        for target in named:
            for n in compute:
                if n.target == target or n.target == f"torch.ops.{target}" or n.target.endswith("." + target):
                    return n, "aten_target"
    frames = _FX_FRAME.findall(f.traceback)
    for name in reversed(frames):
        if name in by_name:
            return by_name[name], "traceback"
    return None, None


def _meaning(graph: GraphRecord, node) -> str:
    """What a node stands for, whatever it is called: its op and target; for a submodule call,
    the module's class (its attribute path is the model author's name)."""
    if node.op == "placeholder":
        return "<input>"
    if node.op == "get_attr":
        return "<attribute>"
    if node.op == "output":
        return "<output>"
    if node.op == "call_module":
        module = _modules(graph).get(node.target)
        return f"module:{module.class_name if module else '?'}"
    return node.target if node.op == "call_function" else f"{node.op}:{node.target}"


def op_name(graph: GraphRecord, node) -> str:
    """A node's op by short name, whatever called it: ``torch.sigmoid``, ``Tensor.sigmoid``
    (``call_method``) and ``aten.sigmoid.default`` are all ``sigmoid``; a submodule call is its
    class (``Linear``)."""
    return _short(_meaning(graph, node))


def _modules(graph: GraphRecord) -> dict[str, ModuleEntry]:
    return {e.path: e for e in graph.module_state if isinstance(e, ModuleEntry)}


def _short(meaning: str) -> str:
    """``torch.ops.aten.relu.default`` -> ``relu``; ``module:torch.nn.Linear`` -> ``Linear``."""
    parts = [p for p in re.split(r"[.:]", meaning) if p and p not in ("default", "Tensor", "Scalar", "module")]
    return parts[-1] if parts else meaning


def _name_meanings(graph: GraphRecord) -> dict[str, str]:
    """Node name -> what a message should say instead: ``<input>`` for an input, the op's short
    name for a computation (``sigmoid_1`` -> ``sigmoid``), the class for a submodule call."""
    out = {}
    for n in graph.nodes:
        meaning = _meaning(graph, n)
        out[n.name] = meaning if meaning.startswith("<") else _short(meaning)
    return out


def _replace_names(text: str, names: dict[str, str]) -> str:
    if not names or not text:
        return text
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                         + r")(?![\w])")
    return pattern.sub(lambda m: names[m.group(1)], text)


# --------------------------------------------------------------------------------------------
# the structure near it


def _refs(value: Any) -> Iterator[str]:
    if isinstance(value, NodeRef):
        yield value.name
    elif isinstance(value, TupleArg):
        for v in value.items:
            yield from _refs(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _refs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _refs(v)
    elif isinstance(value, DictArg):
        for k, v in value.items:
            yield from _refs(k)
            yield from _refs(v)
    elif isinstance(value, SliceArg):
        for v in (value.start, value.stop, value.step):
            yield from _refs(v)


def structure_hash(graph: GraphRecord, node=None) -> str:
    """A hash of the ops within two hops of ``node`` (producers and users), each labelled by
    what it is and by its neighbours' labels (one Weisfeiler-Lehman round), names and shapes
    left out; without a node, of the graph's compute-op multiset."""
    if node is None:
        ops = Counter(op_name(graph, n) for n in graph.nodes if n.op in COMPUTE_OPS)
        return _digest(sorted(ops.items()))
    by_name = {n.name: n for n in graph.nodes}
    inputs = {n.name: [r for r in _refs((n.args, n.kwargs)) if r in by_name] for n in graph.nodes}
    users: dict[str, list[str]] = {name: [] for name in by_name}
    for name, refs in inputs.items():
        for r in refs:
            users[r].append(name)
    ball = {node.name: 0}
    frontier = [node.name]
    for hop in range(1, _HOPS + 1):
        nxt = []
        for name in frontier:
            for other in (*inputs[name], *users[name]):
                if other not in ball:
                    ball[other] = hop
                    nxt.append(other)
        frontier = nxt
    label = {name: op_name(graph, by_name[name]) for name in ball}
    refined = [(ball[name], label[name], tuple(label.get(r, "") for r in inputs[name]),
                tuple(sorted(label.get(u, "") for u in users[name]))) for name in ball]
    return _digest(sorted(refined))


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# groups


@dataclasses.dataclass(frozen=True)
class Grouped:
    """Archives grouped: ``groups`` maps a key to its members (any hashable item per archive),
    largest group first; ``signatures`` holds each key's signature (None: no failure)."""

    groups: dict[tuple, list]
    signatures: dict[tuple, Signature | None]


def group(items: Iterable[tuple[Any, Signature | None]], level: str = DEFAULT_LEVEL) -> Grouped:
    """Group ``(member, signature)`` pairs by the signature's ``level`` key (archives without a
    failure form one group of their own)."""
    if level not in LEVELS:
        raise ValueError(f"unknown grouping level {level!r}: one of {', '.join(LEVELS)}")
    groups: dict[tuple, list] = {}
    signatures: dict[tuple, Signature | None] = {}
    for member, sig in items:
        key = sig.key(level) if sig is not None else (NO_FAILURE,)
        groups.setdefault(key, []).append(member)
        signatures.setdefault(key, sig)
    ordered = dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))
    return Grouped(groups=ordered, signatures=signatures)


def precision_recall(found: Iterable[Iterable[Any]], truth: dict[Any, str]) -> dict[str, float]:
    """Pairwise precision and recall of a grouping against the true bug of each member: of the
    pairs put together, how many share a bug (precision); of the pairs sharing a bug, how many
    were put together (recall)."""
    found = [list(g) for g in found]
    together = sum(len(g) * (len(g) - 1) // 2 for g in found)
    right = sum(n * (n - 1) // 2 for g in found for n in Counter(truth[m] for m in g).values())
    should = sum(n * (n - 1) // 2 for n in Counter(truth.values()).values())
    return {"precision": right / together if together else 1.0, "recall": right / should if should else 1.0,
            "groups": len(found), "bugs": len(set(truth.values())),
            "mixed_groups": sum(1 for g in found if len({truth[m] for m in g}) > 1)}

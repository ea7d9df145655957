"""The inputs half of ``diff``: per input pair, the same blob, the same metadata with other
data, other metadata, other fidelity; and inputs only one side has.

It lives apart from ``triage.diff`` (which compares the failure, the graph and the records and
assembles the report) because pairing inputs across a minified archive and its parent, and
comparing their leaves, is a self-contained piece of its own; ``diff`` calls ``input_diff`` only.
Like the rest of ``diff`` it reads the two indexes alone: equal data is an equal digest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from reproarchive.format.plain import to_plain
from reproarchive.format.schema import (
    DerivedValue,
    Index,
    ScalarValue,
    SequenceValue,
    SubclassValue,
    SymValue,
    TensorEntry,
    TensorValue,
)

_TENSOR_FIELDS = ("dtype", "shape", "stride", "offset", "device", "requires_grad")



def input_diff(a: Index, b: Index, relation: str | None) -> dict:
    """Per input pair: the same blob, the same metadata with different data, different
    metadata (which fields), different fidelity; and inputs only one side has.

    Inputs are paired through a minified archive's record of where each input came from when
    one archive is the other's parent, by name when both sides name the same inputs, else by
    position. Module-state tensors (parameters, buffers and constants stored with the graph)
    are paired by attribute path."""
    aliases = (_alias_map(a), _alias_map(b))
    rows = [_compare(a, b, x, y, ia, ib, aliases) for ia, ib, x, y in _input_pairs(a, b, relation)]
    state_a = {e.path: e.tensor for e in a.graph.module_state if isinstance(e, TensorEntry)}
    state_b = {e.path: e.tensor for e in b.graph.module_state if isinstance(e, TensorEntry)}
    attributes = [_compare(a, b, state_a.get(p), state_b.get(p), p, p, aliases)
                  for p in sorted(set(state_a) | set(state_b))]
    attributes = [r for r in attributes if r["status"] != "same"]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    same = all(r["status"] == "same" for r in rows) and not attributes
    return {"same": same, "counts": counts, "rows": rows, "attributes": attributes,
            "paired_by": _paired_by(a, b, relation)}


def _paired_by(a: Index, b: Index, relation: str | None) -> str:
    if relation == "b_minified_from_a" and b.records.minify is not None and b.records.minify.input_origins:
        return "origin"
    if relation == "a_minified_from_b" and a.records.minify is not None and a.records.minify.input_origins:
        return "origin"
    na, nb = [_name(v) for v in a.inputs], [_name(v) for v in b.inputs]
    if None not in na and None not in nb and len(set(na)) == len(na) and set(na) == set(nb) and na != nb:
        return "name"
    return "position"


def _name(value) -> str | None:
    return getattr(value, "name", None)


def _input_pairs(a: Index, b: Index, relation: str | None):
    """(label A, label B, value A or None, value B or None) in B's order, then A's leftovers.
    A label is the input's position; an input a minified archive cut out of its parent's
    graph is labelled ``node:<name>``."""
    how = _paired_by(a, b, relation)
    if how == "origin":
        flip = relation == "a_minified_from_b"
        parent, child = (b, a) if flip else (a, b)
        used = set()
        out = []
        for j, origin in enumerate(child.records.minify.input_origins[:len(child.inputs)]):
            kind, _, ref = origin.partition(":")
            i = int(ref) if kind == "input" and ref.isdigit() and int(ref) < len(parent.inputs) else None
            if i is not None:
                used.add(i)
            pv = parent.inputs[i] if i is not None else None
            plabel = i if i is not None else origin
            out.append((j, plabel, child.inputs[j], pv) if flip else (plabel, j, pv, child.inputs[j]))
        for i in range(len(parent.inputs)):
            if i not in used:
                out.append((None, i, None, parent.inputs[i]) if flip else (i, None, parent.inputs[i], None))
        return out
    if how == "name":
        where = {_name(v): i for i, v in enumerate(a.inputs)}
        return [(where[_name(v)], j, a.inputs[where[_name(v)]], v) for j, v in enumerate(b.inputs)]
    n = max(len(a.inputs), len(b.inputs))
    return [(i if i < len(a.inputs) else None, i if i < len(b.inputs) else None,
             a.inputs[i] if i < len(a.inputs) else None, b.inputs[i] if i < len(b.inputs) else None) for i in range(n)]


def _compare(a: Index, b: Index, x, y, label_a, label_b, aliases) -> dict:
    row: dict[str, Any] = {"a": label_a, "b": label_b, "name": _name(y) or _name(x),
                           "a_desc": _describe(a, x), "b_desc": _describe(b, y)}
    if x is None or y is None:
        if isinstance(label_a, str) and label_a.startswith("node:"):
            row["status"] = "computed_in_a"  # a value A's graph computes, stored as an input of B
        elif isinstance(label_b, str) and label_b.startswith("node:"):
            row["status"] = "computed_in_b"
        else:
            row["status"] = "only_a" if y is None else "only_b"
        return row
    leaves_a, leaves_b = list(_leaves(x)), list(_leaves(y))
    if [k for k, _ in leaves_a] != [k for k, _ in leaves_b]:
        row.update(status="different_kind", changes=["kind"])
        return row
    statuses, changes = [], []
    for (_, va), (_, vb) in zip(leaves_a, leaves_b):
        status, fields = _compare_leaf(a, b, va, vb, aliases)
        statuses.append(status)
        changes += [f for f in fields if f not in changes]
    order = ("different_kind", "different_metadata", "different_fidelity", "different_value", "different_data",
             "same_metadata_absent", "same")
    row["status"] = min(statuses, key=order.index) if statuses else "same"
    if row["status"] == "same_metadata_absent":
        row["status"] = "same"
        row["note"] = "no data on either side (absent): only the metadata can be compared"
    if changes:
        row["changes"] = changes
    return row


def _leaves(value, path: str = ""):
    if isinstance(value, SequenceValue):
        for k, item in enumerate(value.items):
            yield from _leaves(item, f"{path}[{k}]")
    elif isinstance(value, SubclassValue):  # the class, context and geometry, then each inner tensor
        yield (path, "subclass"), dataclasses.replace(value, items=(), name=None)
        for attr, item in zip(value.attrs, value.items):
            yield from _leaves(item, f"{path}.{attr}")
    else:
        kind = "tensor" if isinstance(value, TensorValue) else value.kind
        yield (path, kind), value


def _compare_leaf(a: Index, b: Index, x, y, aliases) -> tuple[str, list[str]]:
    if isinstance(x, TensorValue):
        sa, sb = a.storages[x.storage], b.storages[y.storage]
        fields = [f for f in _TENSOR_FIELDS if _tensor_field(x, sa, f) != _tensor_field(y, sb, f)]
        if len(aliases[0].get(x.storage, ())) != len(aliases[1].get(y.storage, ())):
            fields.append("aliasing")
        if fields:
            return "different_metadata", fields
        if sa.fidelity != sb.fidelity:
            return "different_fidelity", ["fidelity"]
        if not sa.is_real:
            return "same_metadata_absent", []
        data_a, data_b = (sa.digest, sa.fill, sa.size), (sb.digest, sb.fill, sb.size)
        if data_a == data_b:
            return "same", []
        return "different_data", ["data"]
    if isinstance(x, SymValue):
        return ("same", []) if (x.hint, x.expr) == (y.hint, y.expr) else ("different_value", ["value"])
    if isinstance(x, ScalarValue):
        return ("same", []) if (type(x.value), x.value) == (type(y.value), y.value) else ("different_value", ["value"])
    if isinstance(x, SubclassValue):
        return ("same", []) if x == y else ("different_metadata", ["subclass"])
    if isinstance(x, DerivedValue):  # which input and dimension it is the size of (its symbol's name is a label)
        return ("same", []) if (x.kind, x.input, x.dim) == (y.kind, y.input, y.dim) else ("different_metadata", ["of"])
    return "same", []


def _tensor_field(t: TensorValue, storage, name: str) -> Any:
    return storage.device if name == "device" else getattr(t, name)


def _alias_map(index: Index) -> dict[int, tuple[int, ...]]:
    """Storage -> the positions of the inputs that view it, for storages more than one input
    views (aliasing is metadata: a graph compiled for aliased inputs can fail where the same
    data unaliased passes)."""
    users: dict[int, set[int]] = {}
    for k, value in enumerate(index.inputs):
        for _, leaf in _leaves(value):
            if isinstance(leaf, TensorValue):
                users.setdefault(leaf.storage, set()).add(k)
    return {st: tuple(sorted(ks)) for st, ks in users.items() if len(ks) > 1}


def _describe(index: Index, value) -> str | None:
    """``float32[8, 32] stride [32, 1] cpu, real`` (``+16`` after the stride: a storage offset)."""
    if value is None:
        return None
    if isinstance(value, TensorValue):
        st = index.storages[value.storage]
        fidelity = "zeros" if st.fill == 0 else st.fidelity
        offset = f" +{value.offset}" if value.offset else ""
        grad = " requires_grad" if value.requires_grad else ""
        return f"{value.dtype}{list(value.shape)} stride {list(value.stride)}{offset} {st.device}{grad}, {fidelity}"
    if isinstance(value, SymValue):
        return f"{value.kind} {value.expr} = {value.hint!r}"
    if isinstance(value, DerivedValue):
        return f"{value.kind} of input {value.input}, dim {value.dim}" + (f" ({value.expr})" if value.expr else "")
    if isinstance(value, ScalarValue):
        return f"{value.kind} {value.value!r}"
    if isinstance(value, SequenceValue):
        return f"{value.kind} of {len(value.items)}: " + ", ".join(_describe(index, v) or "" for v in value.items[:4]) \
            + (" ..." if len(value.items) > 4 else "")
    return str(to_plain(value))

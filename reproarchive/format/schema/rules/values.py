"""The rules of storages (spec §6.2) and values (§6.3): each storage is real (one blob of its
size, or zero-filled) or absent, and each value is of its kind, each tensor a view that fits its
storage."""

from __future__ import annotations

import math
from typing import Any

from reproarchive.errors import LimitExceededError, Rule, SchemaViolation
from reproarchive.format.digests import DIGEST_RE
from reproarchive.format.layout import Limits
from reproarchive.format.schema import (
    DTYPES,
    MAX_EXTENT,
    MAX_RANK,
    MAX_VALUE_DEPTH,
    SCALAR_KINDS,
    SYMBOL_KINDS,
    ContainerRecord,
    DerivedValue,
    Fidelity,
    ScalarValue,
    SequenceValue,
    StorageRecord,
    SubclassValue,
    SymValue,
    TensorValue,
)
from reproarchive.format.schema.rules.names import DEVICE_RE, IDENTIFIER_RE, function_name_problem

# -- §6.2 storages -------------------------------------------------------------------------------


def check_storages(storages: tuple[StorageRecord, ...], container: ContainerRecord, caps: Limits) -> None:
    sizes = {m.name: m.size for m in container.members}
    declared = 0
    for i, st in enumerate(storages):
        try:
            _check_storage(st, sizes)
        except SchemaViolation as exc:
            raise exc.at(i).at("storages") from None
        declared += st.size
        if declared > caps.max_total_bytes:
            raise LimitExceededError(f"storages declare more than {caps.max_total_bytes} bytes in total",
                                     "the archive is hostile or damaged", rule=Rule.STORAGE_TOTAL)


def _check_storage(st: StorageRecord, sizes: dict[str, int]) -> None:
    if not 0 <= st.size < MAX_EXTENT:
        raise SchemaViolation(f"size {st.size} is negative or impossibly large", rule=Rule.STORAGE_SIZE)
    if not DEVICE_RE.match(st.device):
        raise SchemaViolation(f"{st.device[:40]!r} is not a device name", rule=Rule.STORAGE_DEVICE)
    if st.fidelity == Fidelity.REAL:
        if (st.digest is None) == (st.fill is None):
            raise SchemaViolation("a real storage has exactly one of digest or fill", rule=Rule.STORAGE_FIDELITY)
        if st.fill is not None and st.fill != 0:
            raise SchemaViolation("fill must be 0", rule=Rule.STORAGE_FIDELITY)
    elif st.fidelity == Fidelity.ABSENT:
        if st.digest is not None or st.fill is not None:
            raise SchemaViolation("an absent storage has neither digest nor fill", rule=Rule.STORAGE_FIDELITY)
    else:
        raise SchemaViolation(f"fidelity must be 'real' or 'absent', not {st.fidelity[:20]!r}",
                              rule=Rule.STORAGE_FIDELITY)
    if st.digest is not None:
        m = DIGEST_RE.match(st.digest)
        if not m:
            raise SchemaViolation(f"malformed digest {st.digest[:80]!r}", rule=Rule.DIGEST_SYNTAX)
        name = f"blobs/{m.group(1)}/{m.group(2)}"
        if name not in sizes:
            raise SchemaViolation(f"refers to blob {name}, which the archive does not hold", rule=Rule.STORAGE_BLOB)
        if sizes[name] != st.size:
            raise SchemaViolation(f"declares {st.size} bytes but blob {name} has {sizes[name]}", rule=Rule.STORAGE_BLOB)


# -- §6.3 values ---------------------------------------------------------------------------------


def view_extent(shape, stride, offset: int) -> int:
    """Elements of storage a view touches (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def check_value(value: Any, storages, path: tuple, depth: int) -> None:
    if depth > MAX_VALUE_DEPTH:
        raise SchemaViolation(f"values nest deeper than {MAX_VALUE_DEPTH}", path, Rule.VALUE_DEPTH)
    if isinstance(value, TensorValue):
        check_tensor(value, storages, path)
    elif isinstance(value, ScalarValue):
        _check_kind(value.value, SCALAR_KINDS[value.kind], (*path, "value"))
    elif isinstance(value, SymValue):
        _check_kind(value.hint, SYMBOL_KINDS[value.kind], (*path, "hint"))
    elif isinstance(value, SequenceValue):
        for j, item in enumerate(value.items):
            check_value(item, storages, (*path, j), depth + 1)
    elif isinstance(value, SubclassValue):
        if function_name_problem(value.cls) is not None:
            raise SchemaViolation(f"subclass name {str(value.cls)[:60]!r} is not a qualified class name",
                                  (*path, "cls"), Rule.VALUE_KIND)
        if len(value.attrs) != len(value.items) or not all(IDENTIFIER_RE.match(a) for a in value.attrs):
            raise SchemaViolation("a subclass needs one identifier per inner value", (*path, "attrs"), Rule.VALUE_KIND)
        for j, item in enumerate(value.items):
            check_value(item, storages, (*path, "items", j), depth + 1)
    elif isinstance(value, DerivedValue):  # only the index's own inputs may be one (check_derived)
        raise SchemaViolation(f"a {value.kind} value is only allowed as one of the index's inputs", path,
                              Rule.DERIVED_INPUT)


def check_derived(value: DerivedValue, inputs, path: tuple) -> None:
    """(R6.3-10) A ``size``/``stride`` input names another input of the index that is a tensor
    or subclass, and one of that input's dimensions."""
    if not 0 <= value.input < len(inputs) or inputs[value.input] is value:
        raise SchemaViolation(f"names input {value.input}, which is not another of the {len(inputs)} inputs",
                              (*path, "input"), Rule.DERIVED_INPUT)
    source = inputs[value.input]
    if not isinstance(source, (TensorValue, SubclassValue)):
        raise SchemaViolation(f"names input {value.input}, a {source.kind}; only a tensor has a {value.kind}",
                              (*path, "input"), Rule.DERIVED_INPUT)
    rank = len(source.shape) if isinstance(source, TensorValue) else len(source.size)
    if not 0 <= value.dim < rank:
        raise SchemaViolation(f"dimension {value.dim} is out of range for input {value.input} of rank {rank}",
                              (*path, "dim"), Rule.DERIVED_INPUT)


def _check_kind(value: Any, expected: type, path: tuple) -> None:
    """A scalar of the kind its record says (an int stands for a float; a bool never for an int)."""
    ok = type(value) is expected or expected is float and type(value) is int
    if not ok:
        raise SchemaViolation(f"expected {expected.__name__ if expected is not type(None) else 'nil'}, "
                              f"got {type(value).__name__}", path, Rule.VALUE_KIND)


def check_tensor(t: TensorValue, storages, path: tuple) -> None:
    def bad(problem: str, rule: Rule):
        return SchemaViolation(problem, path, rule)

    if not 0 <= t.storage < len(storages):
        raise bad(f"storage {t.storage} does not exist", Rule.TENSOR_STORAGE)
    info = DTYPES.get(t.dtype)
    if info is None:
        raise bad(f"unknown dtype {t.dtype[:40]!r} (written by a newer reproarchive or torch?)", Rule.TENSOR_DTYPE)
    itemsize, klass = info
    if len(t.shape) != len(t.stride) or len(t.shape) > MAX_RANK:
        raise bad(f"shape and stride must have the same rank (at most {MAX_RANK})", Rule.TENSOR_GEOMETRY)
    if any(not 0 <= v < MAX_EXTENT for v in t.shape + t.stride) or not 0 <= t.offset < MAX_EXTENT:
        raise bad("sizes, strides and the offset must be non-negative and below 2^62", Rule.TENSOR_GEOMETRY)
    if math.prod(t.shape) >= MAX_EXTENT:
        raise bad("the view has more elements than a tensor can index", Rule.TENSOR_GEOMETRY)
    need = view_extent(t.shape, t.stride, t.offset) * itemsize
    if need > storages[t.storage].size:
        raise bad(f"the view needs {need} bytes but its storage has {storages[t.storage].size}", Rule.TENSOR_FITS)
    if not t.is_leaf and not t.requires_grad:
        raise bad("a non-leaf tensor must require grad", Rule.TENSOR_GRAD)
    if t.requires_grad and klass not in ("float", "complex"):
        raise bad("only floating and complex tensors can require grad", Rule.TENSOR_GRAD)
    if not all(0 <= d < len(t.shape) for d, _ in t.dynamic):
        raise bad("a dynamic dimension is out of range", Rule.TENSOR_DYNAMIC)


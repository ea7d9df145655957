"""Tensors and other graph inputs <-> value records plus raw storage bytes (spec §6).

A tensor is stored as its *storage* (the raw bytes, once per distinct storage) plus a view
record (dtype, shape, stride, offset). That is what keeps inputs bit-exact and keeps aliasing:
two inputs that were views of one storage come back as views of one storage, and two storages
that merely hold equal bytes come back as two storages sharing one blob on disk.

Storages an archive has no data for (``absent``) get generated data here, and only here:
``build_storages`` is the one path from storage records to torch storages, used by ``load``,
``read_input`` and by the dump import's replay at pack time, so every replay of an archive sees
the same generated values.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from reproarchive.compat.fake import guard_scalar, is_fake_tensor
from reproarchive.compat.tensor_internals import (  # the table: standalone.script reads it from here too
    REBUILDABLE_SUBCLASSES,
    is_traceable_wrapper_subclass,
    rebuildable_subclass,
)
from reproarchive.errors import IndexSchemaError, NotReplayableHereError, PackError
from reproarchive.format import schema
from reproarchive.format.schema import (
    DERIVED_KINDS,
    DerivedValue,
    ScalarValue,
    SequenceValue,
    StorageRecord,
    SubclassValue,
    SymValue,
    TensorValue,
)
from reproarchive.format.schema.rules.values import view_extent

FIDELITY_REAL = "real"
FIDELITY_ABSENT = "absent"
ABSENT_SEED = 0


def _torch_dtypes() -> dict[str, torch.dtype]:
    """The storable dtypes (``schema.DTYPES``) this torch has, by name."""
    found = {}
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            key = str(value).removeprefix("torch.")
            if key in schema.DTYPES:
                found[key] = value
    return found


DTYPES: dict[str, torch.dtype] = _torch_dtypes()


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise PackError(f"dtype {dtype} cannot be stored in format {schema.FORMAT_VERSION}",
                        "dequantize the input or convert it to a plain dtype")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    """A dtype the (already validated) index names, in this torch."""
    try:
        return DTYPES[name]
    except KeyError:
        raise IndexSchemaError(
            f"this torch {torch.__version__} has no dtype {name!r}",
            "replay with the torch version recorded in the archive (see `reproarchive inspect`)",
        ) from None


@dataclasses.dataclass(frozen=True)
class AbsentTensor:
    """An input whose metadata is known but whose data is not (e.g. a PyTorch dump without
    storages). Stored with fidelity ``absent``; the loader generates data and says so."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...] | None = None
    storage_offset: int = 0
    device: str = "cpu"
    requires_grad: bool = False
    storage_size: int | None = None  # bytes; default: just large enough for the view

    def contiguous_stride(self) -> tuple[int, ...]:
        stride, acc = [], 1
        for size in reversed(self.shape):
            stride.append(acc)
            acc *= max(size, 1)
        return tuple(reversed(stride))


def storage_view(storage: torch.UntypedStorage) -> memoryview:
    """Zero-copy bytes of a CPU storage (no numpy needed, no copy made)."""
    n = storage.nbytes()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(storage.data_ptr())).cast("B")


def _is_fake(t: torch.Tensor) -> bool:
    return is_fake_tensor(t) or t.device.type == "meta"


def _sym_expr(value) -> str:
    return str(value.node.expr) if hasattr(value, "node") and hasattr(value.node, "expr") else str(value)


def _sym_hint(value):
    node = getattr(value, "node", None)
    if nested_int_key(value) is not None:
        raise PackError(f"a nested int ({value}) is stored only as a size or stride of a graph input, and no input "
                        "has it", "pass the nested jagged tensor it belongs to as an input of the same graph")
    hint = getattr(node, "hint", None)
    if hint is None:
        try:
            hint = guard_scalar(value)
        except Exception as exc:
            raise PackError(f"symbolic value {value} has no concrete hint", "pass concrete example inputs") from exc
    return hint


# --------------------------------------------------------------------------------------------
# encoding


class StorageTable:
    """Assigns one record per distinct storage, keyed by the storage itself, not its bytes.

    ``records`` are complete but for the digest of real storages, which ``pack`` fills in once
    the bytes are hashed (``resolve``); ``sources`` holds each real storage (None when absent).
    """

    def __init__(self, device_names: Mapping[str, str] | None = None):
        # the device a storage is recorded on, by its tensor's device here (``pack``)
        self.device_names = dict(device_names or {})
        self.records: list[StorageRecord] = []
        self.sources: list[torch.UntypedStorage | None] = []
        self._by_id: dict[int, int] = {}

    def add_tensor(self, t: torch.Tensor) -> int:
        if t.layout != torch.strided:
            raise PackError(f"a {t.layout} tensor cannot be stored", "call .to_dense() on the input first")
        if type(t) not in (torch.Tensor, torch.nn.Parameter) and not _is_fake(t):
            raise PackError(
                f"tensor subclass {type(t).__name__} cannot be stored",
                "pass plain tensors (unwrap DTensor / subclasses before packing)",
            )
        storage = t.untyped_storage()
        if _is_fake(t):
            return self._add(None, storage.nbytes(), str(t.device), key=None)
        return self._add(storage, storage.nbytes(), str(t.device), key=storage._cdata)

    def add_absent(self, a: AbsentTensor, stride: tuple[int, ...]) -> int:
        need = view_extent(a.shape, stride, a.storage_offset) * a.dtype.itemsize
        size = need if a.storage_size is None else a.storage_size
        if size < need:
            raise PackError(f"AbsentTensor storage_size {size} is smaller than its view needs ({need})")
        return self._add(None, size, str(torch.device(a.device)), key=None)

    def _add(self, source, size: int, device: str, key) -> int:
        device = self.device_names.get(device, device)
        if key is not None and key in self._by_id:
            return self._by_id[key]
        fidelity = FIDELITY_ABSENT if source is None else FIDELITY_REAL
        self.records.append(StorageRecord(size=size, device=device, fidelity=fidelity))
        self.sources.append(source)
        if key is not None:
            self._by_id[key] = len(self.records) - 1
        return len(self.records) - 1

    def resolve(self, i: int, digest: str | None) -> None:
        """Record how real storage ``i`` is stored: by its blob's digest, or (None) as all zeros."""
        rec = self.records[i]
        self.records[i] = dataclasses.replace(rec, digest=digest, fill=0 if digest is None else None)


def encode_value(value: Any, table: StorageTable, *, name: str | None = None, dynamic=()) -> Any:
    """One graph input (or module tensor) as a value record; tensors register their storage."""
    if isinstance(value, AbsentTensor):
        stride = tuple(value.stride) if value.stride is not None else value.contiguous_stride()
        return _tensor_record(table.add_absent(value, stride), value.dtype, value.shape, stride, value.storage_offset,
                              value.requires_grad, True, name, dynamic)
    if isinstance(value, torch.Tensor) and _traceable_subclass(value):
        return _subclass_record(value, table, name)
    if isinstance(value, torch.Tensor):
        return _tensor_record(table.add_tensor(value), value.dtype, tuple(value.shape), tuple(value.stride()),
                              value.storage_offset(), value.requires_grad, value.is_leaf, name, dynamic)
    for kind, cls in (("bool", bool), ("int", int), ("float", float), ("str", str)):  # bool before int
        if isinstance(value, cls):
            return ScalarValue(kind, cls(value))
    if value is None:
        return ScalarValue("none")
    for kind, cls, plain in (("symbool", torch.SymBool, bool), ("symint", torch.SymInt, int),
                             ("symfloat", torch.SymFloat, float)):
        if isinstance(value, cls):
            return SymValue(kind, plain(_sym_hint(value)), _sym_expr(value))
    if isinstance(value, (tuple, list)):
        return SequenceValue("list" if isinstance(value, list) else "tuple",
                             tuple(encode_value(v, table) for v in value))
    raise PackError(
        f"input of type {type(value).__module__}.{type(value).__qualname__} cannot be stored",
        "graph inputs must be tensors, ints, floats, bools, None, SymInts or tuples/lists of these",
    )


def encode_inputs(values: Sequence[Any], table: StorageTable, names: Sequence[str | None] = (),
                  dynamics: Sequence[Any] = ()) -> tuple:
    """The graph inputs as value records (``encode_value``), with a nested int (a nested jagged
    tensor's ragged size, ``j1``, that Dynamo passes as an input of its own) recorded as the
    size or stride of the input tensor that has it (a ``DerivedValue``): it exists only as a
    property of that tensor, so a loader computes it from the rebuilt one (``decode_inputs``)."""
    names = list(names) or [None] * len(values)
    dynamics = list(dynamics) or [()] * len(values)
    out = []
    for i, value in enumerate(values):
        key = nested_int_key(value)
        if key is None:
            out.append(encode_value(value, table, name=names[i], dynamic=dynamics[i]))
            continue
        where = nested_int_owner(values, key)
        if where is None:
            _sym_hint(value)  # refuses it, saying why
        symbol = value.node.nested_int() is None  # Dynamo's symbol for it (s21), else the nested int itself
        out.append(DerivedValue(kind=where[0], input=where[1], dim=where[2], expr=_sym_expr(value) if symbol else None))
    return tuple(out)


def nested_int_key(value: Any) -> tuple[int, int] | None:
    """(id, coefficient) of a nested int (``j1``, ``4*j1``): the value itself (what an NJT's
    size holds), or a symbol whose hint is one (what Dynamo hands a backend); None otherwise."""
    if not isinstance(value, torch.SymInt):
        return None
    node = value.node
    if not getattr(node, "is_nested_int", lambda: False)():
        return None
    for nested in (node, getattr(getattr(node, "hint", None), "node", None)):
        if nested is not None and nested.nested_int() is not None:
            return int(nested.nested_int()), int(nested.nested_int_coeff())
    return None


def nested_int_owner(values: Sequence[Any], key: tuple[int, int]) -> tuple[str, int, int] | None:
    """(``size`` or ``stride``, input, dimension) of the first tensor input whose size (then
    stride) at that dimension is the nested int ``key``."""
    for kind in DERIVED_KINDS:
        for k, t in enumerate(values):
            if isinstance(t, torch.Tensor) and not _is_fake(t):
                geometry = t.size() if kind == "size" else t.stride()
                for d, v in enumerate(geometry):
                    if nested_int_key(v) == key:
                        return kind, k, d
    return None


def _traceable_subclass(t: torch.Tensor) -> bool:
    return type(t) not in (torch.Tensor, torch.nn.Parameter) and not _is_fake(t) and is_traceable_wrapper_subclass(t)


def _subclass_record(t: torch.Tensor, table: StorageTable, name: str | None) -> SubclassValue:
    """A traceable subclass through its flatten protocol: inner tensors as ordinary records (their
    storages shared and deduplicated like any), the context as plain data."""
    cls = f"{type(t).__module__}.{type(t).__qualname__}"
    attrs, context = t.__tensor_flatten__()
    try:
        plain = _plain_context(context)
    except TypeError as exc:
        hint = ("a DTensor is recorded with its mesh by a job archive (capture every rank)"
                if type(t).__name__ == "DTensor" else "pass plain tensors, or the subclass's inner tensors")
        raise PackError(f"tensor subclass {cls}: its flatten context holds {exc}, which cannot be stored as data",
                        hint) from None
    size, stride = _geometry_text(tuple(t.shape), tuple(t.stride()))
    return SubclassValue(cls=cls, attrs=tuple(attrs), items=tuple(encode_value(getattr(t, a), table) for a in attrs),
                         context=plain, size=size, stride=stride, requires_grad=bool(t.requires_grad), name=name)


def _geometry_text(size: tuple, stride: tuple) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A subclass's outer size and stride as text, its nested ints numbered ``j1``, ``j2`` in
    order of appearance: torch numbers them per process, and the same tensor must give the same
    bytes whatever the process made before."""
    ids: dict[int, int] = {}

    def text(v) -> str:
        key = nested_int_key(v)
        if key is None:
            return str(v)
        n = ids.setdefault(key[0], len(ids) + 1)
        return f"j{n}" if key[1] == 1 else f"{key[1]}*j{n}"

    return tuple(map(text, size)), tuple(map(text, stride))


def _plain_context(value: Any) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain_context(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain_context(v) for k, v in value.items()}
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__}")


def _tensor_record(storage, dtype, shape, stride, offset, requires_grad, is_leaf, name, dynamic) -> TensorValue:
    return TensorValue(
        storage=storage, dtype=dtype_name(dtype), shape=tuple(int(s) for s in shape),
        stride=tuple(int(s) for s in stride), offset=int(offset), requires_grad=bool(requires_grad),
        is_leaf=bool(is_leaf), dynamic=tuple((int(d), str(e)) for d, e in dynamic), name=name,
    )


# --------------------------------------------------------------------------------------------
# decoding


def storage_dtypes(tensors: Iterable[TensorValue]) -> dict[int, torch.dtype]:
    """The dtype of the first tensor viewing each storage: what generated data is shaped for."""
    found: dict[int, torch.dtype] = {}
    for t in tensors:
        if t.storage not in found:
            found[t.storage] = dtype_from_name(t.dtype)
    return found


def generate_absent(storage: torch.UntypedStorage, dtype: torch.dtype, seed: int, demand: Any = None) -> None:
    """Fill an absent storage with seeded data that fits its dtype (never claimed to be real):
    normal values for floating and complex dtypes, integers in [0, 16), random bools. An integer
    storage the graph uses as an index or as offsets (``demand``, an ``input_demands.Demand``)
    gets integers in [low, low + min(16, high - low)), or sorted offsets from 0 up to ``high``."""
    n = storage.nbytes() // max(dtype.itemsize, 1)
    if n == 0:
        return
    gen = torch.Generator(device="cpu").manual_seed(seed)
    target = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, (n,), (1,))
    if dtype == torch.bool:
        values = torch.randint(0, 2, (n,), generator=gen).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        real = torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32
        values = torch.randn((n,), generator=gen, dtype=real)
        if dtype.is_complex:
            values = torch.complex(values, torch.randn((n,), generator=gen, dtype=real))
    elif dtype.is_signed or dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        low, high = 0, 16
        if demand is not None and demand.kind == "index":
            low = demand.low if dtype.is_signed else max(0, demand.low)
            high = low + max(1, min(16, demand.high - low))
        values = torch.randint(low, high, (n,), generator=gen, dtype=torch.int64)
        if demand is not None and demand.kind == "offsets":
            values = torch.randint(0, demand.high + 1, (n,), generator=gen, dtype=torch.int64).sort().values
            values[0] = 0
    else:
        return  # bit types: zeros are as good as anything
    target.copy_(values.to(dtype))


def build_storages(records: Sequence[StorageRecord], which: Iterable[int], devices: Sequence[torch.device],
                   dtypes: dict[int, torch.dtype], real: Callable[[int], torch.UntypedStorage],
                   demands: dict[int, Any] | None = None) -> list:
    """Storages ``which`` of a storage table on their devices (the rest stay None).

    ``real(i)`` supplies the bytes of real storage ``i`` (from its blob, or a live tensor);
    all-zero storages are allocated here and absent ones filled by ``generate_absent`` with seed
    ``ABSENT_SEED + i``: the storage's position, so the same archive always gets the same data,
    and ``demands`` (``input_demands.storage_demands``): what the graph needs of storage ``i``.
    """
    out: list = [None] * len(records)
    for i in which:
        rec, dev = records[i], devices[i]
        if rec.fidelity == FIDELITY_ABSENT:
            st = torch.empty(rec.size, dtype=torch.uint8, device=dev).untyped_storage()
            generate_absent(st, dtypes.get(i, torch.uint8), ABSENT_SEED + i, (demands or {}).get(i))
        elif rec.fill == 0:
            st = torch.zeros(rec.size, dtype=torch.uint8, device=dev).untyped_storage()
        else:
            st = real(i)
        out[i] = st
    return out


class ValueDecoder:
    """Turns value records back into Python values over already-built storages."""

    def __init__(self, storages: list[torch.UntypedStorage], devices: Sequence[torch.device]):
        self.storages, self.devices = storages, devices

    def decode(self, rec: Any) -> Any:
        if isinstance(rec, TensorValue):
            return self.tensor(rec)
        if isinstance(rec, SequenceValue):
            items = [self.decode(r) for r in rec.items]
            return tuple(items) if rec.kind == "tuple" else items
        if isinstance(rec, SymValue):
            return schema.SYMBOL_KINDS[rec.kind](rec.hint)
        if isinstance(rec, SubclassValue):
            return rebuild_subclass(rec, [self.decode(r) for r in rec.items])
        return float(rec.value) if rec.kind == "float" else rec.value

    def tensor(self, rec: TensorValue) -> torch.Tensor:
        t = torch.empty(0, dtype=dtype_from_name(rec.dtype), device=self.devices[rec.storage])
        t.set_(self.storages[rec.storage], rec.offset, rec.shape, rec.stride)
        if rec.requires_grad:
            t.requires_grad_(True)
            if not rec.is_leaf:
                # A view with autograd history: non-leaf like the original, same storage,
                # so aliasing with other inputs survives.
                t = t.view_as(t)
        return t


def decode_inputs(decoder: ValueDecoder, records: Sequence[Any]) -> list:
    """The index's inputs as values: every stored one decoded, then each ``DerivedValue``
    computed from the input it names (a nested jagged tensor's rebuilt ragged size, ``j1``)."""
    args = [None if isinstance(r, DerivedValue) else decoder.decode(r) for r in records]
    for i, r in enumerate(records):
        if isinstance(r, DerivedValue):
            args[i] = derived_value(r, args[r.input])
    return args


def derived_value(rec: DerivedValue, source: torch.Tensor) -> Any:
    """The size or stride ``rec`` names of ``source`` (a rebuilt input)."""
    return source.size(rec.dim) if rec.kind == "size" else source.stride(rec.dim)


def rebuild_subclass(rec: SubclassValue, inner: list[Any]) -> torch.Tensor:
    """The subclass ``rec`` records, rebuilt through its unflatten protocol over ``inner``."""
    cls = rebuildable_subclass(rec.cls)
    if cls is None:
        raise NotReplayableHereError(
            f"an input is a tensor subclass {rec.cls[:120]}, which reproarchive does not rebuild: not replayable here",
            f"rebuildable subclasses: {', '.join(sorted(REBUILDABLE_SUBCLASSES))}; the archive's inner tensors are "
            "still readable (`reproarchive inspect`)")
    concrete = all(s.isdigit() for s in (*rec.size, *rec.stride))  # else the class works its geometry out
    t = cls.__tensor_unflatten__(dict(zip(rec.attrs, inner)), rec.context,
                                 torch.Size(int(s) for s in rec.size) if concrete else None,
                                 tuple(int(s) for s in rec.stride) if concrete else None)
    if rec.requires_grad and not t.requires_grad:
        t.requires_grad_(True)
    return t

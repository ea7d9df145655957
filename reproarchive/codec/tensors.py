"""Tensors and other graph inputs <-> index records plus raw storage bytes (spec §6).

A tensor is stored as its *storage* (the raw bytes, once per distinct storage) plus a view
record (dtype, shape, stride, offset). That is what keeps inputs bit-exact and keeps aliasing:
two inputs that were views of one storage come back as views of one storage, and two storages
that merely hold equal bytes come back as two storages sharing one blob on disk.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import re
from typing import Any, Sequence

import torch

from reproarchive.errors import IndexSchemaError, PackError

FIDELITY_REAL = "real"
FIDELITY_ABSENT = "absent"
ABSENT_SEED = 0


def _all_dtypes() -> dict[str, torch.dtype]:
    found = {}
    for name in dir(torch):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            found[str(value).removeprefix("torch.")] = value
    return found


DTYPES: dict[str, torch.dtype] = _all_dtypes()
_QUANTIZED = {name for name in DTYPES if name.startswith(("qint", "quint"))}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES or name in _QUANTIZED:
        raise PackError(f"dtype {dtype} cannot be stored", "dequantize the input or convert it to a plain dtype")
    return name


def dtype_from_name(name: object) -> torch.dtype:
    if not isinstance(name, str) or name not in DTYPES or name in _QUANTIZED:
        raise IndexSchemaError(
            f"unknown dtype {str(name)[:40]!r}",
            "the archive was written with a newer torch; install that torch version or newer",
        )
    return DTYPES[name]


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


def view_extent(shape: Sequence[int], stride: Sequence[int], offset: int) -> int:
    """Elements of storage a view touches (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def storage_view(storage: torch.UntypedStorage) -> memoryview:
    """Zero-copy bytes of a CPU storage (no numpy needed, no copy made)."""
    n = storage.nbytes()
    if n == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * n).from_address(storage.data_ptr())).cast("B")


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.device.type == "meta"


def _sym_expr(value) -> str:
    return str(value.node.expr) if hasattr(value, "node") and hasattr(value.node, "expr") else str(value)


def _sym_hint(value):
    node = getattr(value, "node", None)
    hint = getattr(node, "hint", None)
    if hint is None:
        try:
            from torch.fx.experimental.symbolic_shapes import guard_scalar

            hint = guard_scalar(value)
        except Exception as exc:
            raise PackError(f"symbolic value {value} has no concrete hint", "pass concrete example inputs") from exc
    return hint


class StorageTable:
    """Assigns one record per distinct storage, keyed by the storage itself, not its bytes."""

    def __init__(self):
        self.records: list[dict] = []
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
        if key is not None and key in self._by_id:
            return self._by_id[key]
        self.records.append(
            {"size": size, "device": device, "fidelity": FIDELITY_ABSENT if source is None else FIDELITY_REAL, "digest": None, "fill": None}
        )
        self.sources.append(source)
        if key is not None:
            self._by_id[key] = len(self.records) - 1
        return len(self.records) - 1


def _check_int(value: int, what: str) -> int:
    if not -(1 << 63) <= value < (1 << 63):
        raise PackError(f"{what} {value} does not fit in 64 bits")
    return value


def encode_value(value: Any, table: StorageTable, *, name: str | None = None, dynamic=None) -> dict:
    """One graph input (or module tensor) as a record; tensors register their storage."""
    if isinstance(value, AbsentTensor):
        stride = tuple(value.stride) if value.stride is not None else value.contiguous_stride()
        return _tensor_record(
            table.add_absent(value, stride), value.dtype, value.shape, stride, value.storage_offset,
            value.requires_grad, True, name, dynamic,
        )
    if isinstance(value, torch.Tensor):
        return _tensor_record(
            table.add_tensor(value), value.dtype, tuple(value.shape), tuple(value.stride()), value.storage_offset(),
            value.requires_grad, value.is_leaf, name, dynamic,
        )
    if isinstance(value, bool):
        return {"kind": "bool", "value": value}
    if isinstance(value, int):
        return {"kind": "int", "value": _check_int(value, "int input")}
    if isinstance(value, float):
        return {"kind": "float", "value": value}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, str):
        return {"kind": "str", "value": value}
    if isinstance(value, torch.SymBool):
        return {"kind": "symbool", "hint": bool(_sym_hint(value)), "expr": _sym_expr(value)}
    if isinstance(value, torch.SymInt):
        return {"kind": "symint", "hint": _check_int(int(_sym_hint(value)), "SymInt hint"), "expr": _sym_expr(value)}
    if isinstance(value, torch.SymFloat):
        return {"kind": "symfloat", "hint": float(_sym_hint(value)), "expr": _sym_expr(value)}
    if isinstance(value, (tuple, list)):
        kind = "list" if isinstance(value, list) else "tuple"
        return {"kind": kind, "items": [encode_value(v, table) for v in value]}
    raise PackError(
        f"input of type {type(value).__module__}.{type(value).__qualname__} cannot be stored",
        "graph inputs must be tensors, ints, floats, bools, None, SymInts or tuples/lists of these",
    )


def _tensor_record(storage, dtype, shape, stride, offset, requires_grad, is_leaf, name, dynamic) -> dict:
    shape = [_check_int(int(s), "tensor size") for s in shape]
    stride = [_check_int(int(s), "tensor stride") for s in stride]
    return {
        "kind": "tensor",
        "storage": storage,
        "dtype": dtype_name(dtype),
        "shape": shape,
        "stride": stride,
        "offset": _check_int(int(offset), "storage offset"),
        "requires_grad": bool(requires_grad),
        "is_leaf": bool(is_leaf),
        "dynamic": [[int(d), str(e)] for d, e in (dynamic or [])],
        "name": name,
    }


# --------------------------------------------------------------------------------------------
# Validation and decoding

_DEVICE_RE = re.compile(r"^[a-z][a-z0-9_]*(?::[0-9]{1,4})?$")
_KINDS = {"tensor", "bool", "int", "float", "none", "str", "symint", "symfloat", "symbool", "tuple", "list"}
MAX_VALUE_DEPTH = 32


def _need(rec: dict, key: str, types, where: str):
    value = rec.get(key)
    if not isinstance(value, types) or (types is int and isinstance(value, bool)):
        raise IndexSchemaError(f"{where}: field {key!r} is missing or has the wrong type")
    return value


def validate_storage(rec: object, i: int) -> None:
    where = f"storages[{i}]"
    if not isinstance(rec, dict):
        raise IndexSchemaError(f"{where} is not a map")
    size = _need(rec, "size", int, where)
    if not 0 <= size < 1 << 62:
        raise IndexSchemaError(f"{where}: size {size} is negative or impossibly large")
    device = _need(rec, "device", str, where)
    if not _DEVICE_RE.match(device):
        raise IndexSchemaError(f"{where}: {device[:40]!r} is not a device name")
    try:
        torch.device(device)
    except RuntimeError:
        raise IndexSchemaError(
            f"{where}: device type {device[:40]!r} is unknown to this torch {torch.__version__}",
            "replay with the torch version recorded in the archive",
        ) from None
    fidelity = rec.get("fidelity")
    digest, fill = rec.get("digest"), rec.get("fill")
    if fidelity == FIDELITY_REAL:
        if (digest is None) == (fill is None):
            raise IndexSchemaError(f"{where}: a real storage has exactly one of digest or fill")
        if fill is not None and fill != 0:
            raise IndexSchemaError(f"{where}: fill must be 0")
    elif fidelity == FIDELITY_ABSENT:
        if digest is not None or fill is not None:
            raise IndexSchemaError(f"{where}: an absent storage has neither digest nor fill")
    else:
        raise IndexSchemaError(f"{where}: fidelity must be 'real' or 'absent', not {str(fidelity)[:20]!r}")


def validate_value(rec: object, storages: list[dict], where: str, depth: int = 0) -> None:
    if depth > MAX_VALUE_DEPTH:
        raise IndexSchemaError(f"{where}: values nest deeper than {MAX_VALUE_DEPTH}")
    if not isinstance(rec, dict) or rec.get("kind") not in _KINDS:
        raise IndexSchemaError(f"{where}: not a value record")
    kind = rec["kind"]
    if kind == "tensor":
        sidx = _need(rec, "storage", int, where)
        if not 0 <= sidx < len(storages):
            raise IndexSchemaError(f"{where}: storage {sidx} does not exist")
        dtype = dtype_from_name(rec.get("dtype"))
        shape = _need(rec, "shape", list, where)
        stride = _need(rec, "stride", list, where)
        offset = _need(rec, "offset", int, where)
        if len(shape) != len(stride) or len(shape) > 64:
            raise IndexSchemaError(f"{where}: shape and stride must have the same rank (at most 64)")
        for v in shape + stride:
            if type(v) is not int or v < 0 or v >= 1 << 62:
                raise IndexSchemaError(f"{where}: sizes and strides must be non-negative integers")
        if offset < 0:
            raise IndexSchemaError(f"{where}: negative storage offset")
        if math.prod(shape) >= 1 << 62:
            raise IndexSchemaError(f"{where}: the view has more elements than a tensor can index")
        need = view_extent(shape, stride, offset) * dtype.itemsize
        if need > storages[sidx]["size"]:
            raise IndexSchemaError(f"{where}: view needs {need} bytes but its storage has {storages[sidx]['size']}")
        _need(rec, "requires_grad", bool, where)
        _need(rec, "is_leaf", bool, where)
        if not rec["is_leaf"] and not rec["requires_grad"]:
            raise IndexSchemaError(f"{where}: a non-leaf tensor must require grad")
        if rec["requires_grad"] and not (dtype.is_floating_point or dtype.is_complex):
            raise IndexSchemaError(f"{where}: only floating and complex tensors can require grad")
        dynamic = rec.get("dynamic", [])
        if not isinstance(dynamic, list) or not all(
            isinstance(d, list) and len(d) == 2 and type(d[0]) is int and 0 <= d[0] < len(shape) and isinstance(d[1], str)
            for d in dynamic
        ):
            raise IndexSchemaError(f"{where}: malformed dynamic dimensions")
    elif kind in ("tuple", "list"):
        items = _need(rec, "items", list, where)
        for j, item in enumerate(items):
            validate_value(item, storages, f"{where}[{j}]", depth + 1)
    elif kind in ("symint", "symfloat", "symbool"):
        types = {"symint": int, "symfloat": (float, int), "symbool": bool}[kind]
        _need(rec, "hint", types, where)
        _need(rec, "expr", str, where)
    elif kind != "none":
        types = {"bool": bool, "int": int, "float": (float, int), "str": str}[kind]
        value = rec.get("value")
        if not isinstance(value, types) or (kind == "int" and isinstance(value, bool)):
            raise IndexSchemaError(f"{where}: {kind} value has the wrong type")


def generate_absent(storage: torch.UntypedStorage, dtype: torch.dtype, seed: int) -> None:
    """Fill an absent storage with seeded data that fits its dtype (never claimed to be real)."""
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
        values = torch.randint(0, 16, (n,), generator=gen, dtype=torch.int64)
    else:
        return  # bit types: zeros are as good as anything
    target.copy_(values.to(dtype))


class ValueDecoder:
    """Turns value records back into Python values over already-loaded storages."""

    def __init__(self, storages: list[torch.UntypedStorage], records: list[dict], devices: list[torch.device]):
        self.storages, self.records, self.devices = storages, records, devices

    def decode(self, rec: dict) -> Any:
        kind = rec["kind"]
        if kind == "tensor":
            return self._tensor(rec)
        if kind in ("tuple", "list"):
            items = [self.decode(r) for r in rec["items"]]
            return tuple(items) if kind == "tuple" else items
        if kind == "none":
            return None
        if kind in ("symint", "symfloat", "symbool"):
            return {"symint": int, "symfloat": float, "symbool": bool}[kind](rec["hint"])
        if kind == "float":
            return float(rec["value"])
        return rec["value"]

    def _tensor(self, rec: dict) -> torch.Tensor:
        sidx = rec["storage"]
        dtype = dtype_from_name(rec["dtype"])
        t = torch.empty(0, dtype=dtype, device=self.devices[sidx])
        t.set_(self.storages[sidx], rec["offset"], rec["shape"], rec["stride"])
        if rec["requires_grad"]:
            t.requires_grad_(True)
            if not rec["is_leaf"]:
                # A view with autograd history: non-leaf like the original, same storage,
                # so aliasing with other inputs survives.
                t = t.view_as(t)
        return t

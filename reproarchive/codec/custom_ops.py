"""Custom ops as data (spec §8 ``custom_ops``): what an operator of a library outside torch is,
where its implementation came from, and what it returned in the failing run.

A graph that calls ``torch.ops.mylib.op`` can only replay where ``mylib`` is loaded. So the
capture side records, per custom op, its schema, dispatch keys, whether it had a fake
implementation and the provenance of its implementation (a digest of the Python source or of
the shared library, so ``doctor`` can say the op here is not the one that failed), and, where
the source runs the graph on real data anyway, the op's real outputs for each call, keyed by
the content of its arguments (``argument_key``). ``replay.stand_ins`` turns those calls back
into an operator when the library is missing.

Which namespaces are torch's own is a reviewed list (``TORCH_NAMESPACES``), not "whatever is
registered now": in a capturing process the user's libraries are registered too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from reproarchive.compat.dispatch import (
    OpOverload,
    OpOverloadPacket,
    dispatch_dump,
    has_registered_fake,
    python_custom_op,
)
from reproarchive.format.schema import CustomOpRecord, OpProvenance

#: Operator namespaces torch registers itself, 2.11 to 2.15 (``tests/codec/test_custom_ops.py``
#: checks the list against a fresh process of the torch under test); an operator in any other
#: namespace is a custom op.
TORCH_NAMESPACES = frozenset({
    "_c10d_functional", "_c10d_functional_autograd", "_dtensor", "_native", "_quantized", "_test", "aten", "c10d",
    "debug_mode_ops", "debugprims", "export", "inductor", "inductor_prims", "mkl", "mkldnn", "mkldnn_prepacked",
    "onednn", "prims", "profiler", "quantization", "quantized", "rngprims", "sparse", "static_runtime", "symm_mem",
    "prim", "_inductor_test", "higher_order", "streams", "fsdp", "_dynamo_testing", "tensorrt", "onnx",
    "c10d_functional", "flex_lib", "onnx_symbolic", "quantized_decomposed",  # registered by inductor's import
    "_native_aot", "coor", "flex_gemm", "mempool",  # torch 2.15's
})

_KEY_LINE = re.compile(r"^(\w+)(?:\[alias\])?: registered at (.*?)(?::\d+)?(?: :: .*)?$")


#: Namespaces reproarchive registers itself: a Triton kernel's stand-in (``codec.triton_kernels``)
#: is recorded as the launch it stands for, never as a custom op.
OWN_NAMESPACES = frozenset({"reproarchive_triton"})


def is_custom(target: Any) -> bool:
    """An operator (an overload, or a packet as Dynamo's graphs call it) outside torch's namespaces."""
    if isinstance(target, OpOverloadPacket):
        namespace = target._qualified_op_name.partition("::")[0]
    elif isinstance(target, OpOverload):
        namespace = target.namespace
    else:
        return False
    return namespace not in TORCH_NAMESPACES and namespace not in OWN_NAMESPACES


def overload_of(target: Any) -> OpOverload:
    """The overload a call of ``target`` runs: itself, or a packet's ``default`` (its first
    overload when it has none; a packet of a custom op usually has one overload)."""
    if isinstance(target, OpOverload):
        return target
    names = target.overloads()
    return getattr(target, "default" if "default" in names else names[0])


def op_name(op: OpOverload) -> str:
    """``ns::op.overload``: how the index names an operator (``default`` included)."""
    return f"{op.namespace}::{op._opname}.{op._overloadname}"


def target_name(name: str) -> str:
    """The graph target of an index op name: ``ns::op.overload`` -> ``torch.ops.ns.op.overload``."""
    return "torch.ops." + name.replace("::", ".", 1)


def custom_ops_of(gm: Any) -> list[OpOverload]:
    """The custom ops a GraphModule (and its subgraphs) calls, in first-use order."""
    found: dict[str, OpOverload] = {}
    for module in gm.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            if node.op == "call_function" and is_custom(node.target):
                op = overload_of(node.target)
                found.setdefault(op_name(op), op)
    return list(found.values())


def _registrations(qualname: str) -> dict[str, str]:
    """Dispatch key -> where its kernel was registered, from the dispatcher's own dump."""
    out: dict[str, str] = {}
    for line in dispatch_dump(qualname).splitlines():
        m = _KEY_LINE.match(line.strip())
        if m and m.group(1) not in ("debug",):
            out[m.group(1)] = m.group(2)
    return out


def _sha256_file(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return f"sha256:{h.hexdigest()}"
    except OSError:
        return None


def _loaded_libraries() -> list[str]:
    """Shared libraries of this process that may hold operators: ``torch.ops.load_library``'s
    and extension modules outside torch."""
    torch_dir = os.path.dirname(torch.__file__)
    found = [str(p) for p in getattr(torch.ops, "loaded_libraries", ())]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".so") and not path.startswith(torch_dir):
            found.append(path)
    return list(dict.fromkeys(found))


def provenance(op: OpOverload) -> OpProvenance:
    """Where ``op``'s implementation came from, as far as this process can tell."""
    qualname = f"{op.namespace}::{op._opname}"
    definition = python_custom_op(qualname)
    fn = getattr(definition, "_init_fn", None)
    if fn is not None:
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            source = None
        digest = f"sha256:{hashlib.sha256(source.encode()).hexdigest()}" if source is not None else None
        return OpProvenance(kind="python", module=getattr(fn, "__module__", None), digest=digest)
    places = {p for k, p in _registrations(qualname).items() if k not in ("Meta",)}
    sources = [p for p in places if not p.endswith(".py")]
    libraries = _loaded_libraries()
    for src in sources:  # a library built next to its source (cpp_extension) or beside it
        for lib in libraries:
            if os.path.dirname(lib) == os.path.dirname(src):
                return OpProvenance(kind="library", library=os.path.basename(lib), digest=_sha256_file(lib))
    if sources and len(libraries) == 1:
        return OpProvenance(kind="library", library=os.path.basename(libraries[0]), digest=_sha256_file(libraries[0]))
    return OpProvenance(kind="python" if places and not sources else "unknown")


def describe(op: OpOverload) -> CustomOpRecord:
    """The record of ``op`` without calls: schema, dispatch keys, fake implementation, provenance."""
    qualname = f"{op.namespace}::{op._opname}"
    keys = tuple(sorted(_registrations(qualname)))
    fake = "Meta" in keys or _has_fake(qualname)
    return CustomOpRecord(name=op_name(op), schema=str(op._schema), dispatch_keys=keys, fake=fake,
                          provenance=provenance(op))


def _has_fake(qualname: str) -> bool:
    try:
        return has_registered_fake(qualname)
    except Exception:  # noqa: BLE001 - a private registry; absence means "not known"
        return False


# --------------------------------------------------------------------------------------------
# calls: arguments by content, outputs as recorded


def tensor_key(t: torch.Tensor, *, content: bool = True) -> str:
    """``<dtype>[<shape>] <sha256 of the contiguous bytes>``; ``content=False``: the metadata
    part only (what a fake implementation can see)."""
    meta = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
    if not content:
        return meta
    data = t.detach().contiguous().cpu().reshape(-1)  # row-major bytes, whatever the strides
    digest = hashlib.sha256(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"").hexdigest()
    return f"{meta} sha256:{digest}"


def _plain(value: Any, *, content: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return tensor_key(value, content=content)
    if isinstance(value, (list, tuple)):
        return [_plain(v, content=content) for v in value]
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)[:200]


def argument_key(schema: Any, args: tuple, kwargs: dict, *, content: bool = True) -> tuple:
    """Every schema argument of one call, bound by name (defaults filled in), by content."""
    out = []
    positional = list(args)
    for i, a in enumerate(schema.arguments):
        if i < len(positional) and not a.kwarg_only:
            value = positional[i]
        elif a.name in kwargs:
            value = kwargs[a.name]
        elif a.has_default_value():
            value = a.default_value
        else:
            value = None
        out.append(_plain(value, content=content))
    return tuple(out)


def meta_key(key: Iterable[Any]) -> tuple:
    """A content key with the digests dropped: what the fake implementation matches on."""
    def strip(v):
        if isinstance(v, str) and " sha256:" in v:
            return v.split(" sha256:")[0]
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return tuple(strip(v) for v in key)


@dataclasses.dataclass
class LiveCall:
    """One recorded call in memory: its argument key and its outputs (tensors, values)."""

    arguments: tuple
    outputs: tuple


@dataclasses.dataclass
class LiveCustomOp:
    """A custom op of a graph in memory: its record (without calls) and its calls' live outputs;
    what ``pack`` writes and what ``load`` gives back."""

    record: CustomOpRecord
    calls: list[LiveCall] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return self.record.name


def returned(schema: Any, out: Any) -> tuple:
    """An op's result as the tuple of its schema's returns."""
    if not schema.returns:
        return ()
    return (out,) if len(schema.returns) == 1 else tuple(out)


def described(gm: Any) -> list[LiveCustomOp]:
    """The custom ops of ``gm`` without calls (a source that cannot run them on real data)."""
    return [LiveCustomOp(describe(op)) for op in custom_ops_of(gm)]


def registered_here(name: str) -> OpOverload | None:
    """The operator ``ns::op.overload`` as this process has it (an attribute walk on
    ``torch.ops``, never an import), or None."""
    namespace, _, rest = name.partition("::")
    opname, _, overload = rest.partition(".")
    if not all(re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", p or "") for p in (namespace, opname, overload)):
        return None
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), opname), overload)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, OpOverload) else None


def differences(records, *, stand_ins: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Rows for ``doctor`` (``replay.differences``): each recorded custom op that is missing
    here, stood in for, or whose schema or implementation (provenance digest) differs."""
    rows = []
    stood_in = set(stand_ins)
    for record in records or ():
        recorded = provenance_text(record.provenance)
        op = None if record.name in stood_in else registered_here(record.name)
        if op is None:
            current = (f"not registered here: `run` replays it from its {len(record.calls)} recorded call(s); "
                       "bring it with --import MODULE or --load-library PATH")
        else:
            here = describe(op)
            if here.schema != record.schema:
                current = f"schema here {here.schema}"
            elif (here.provenance.digest or None) != (record.provenance.digest if record.provenance else None):
                current = f"another implementation here: {provenance_text(here.provenance)}"
            else:
                continue
        rows.append({"what": "custom op", "name": record.name, "recorded": recorded, "current": current,
                     "important": True})
    return rows


def provenance_text(p: OpProvenance | None) -> str:
    """Where a recorded implementation came from, in words (its module or library and digest)."""
    if p is None:
        return "provenance not recorded"
    where = p.library or p.module or p.kind
    return f"{where} {p.digest[:19] + '...' if p.digest else '(no digest)'}"


def library_digest(path: str | os.PathLike) -> str | None:
    """The ``sha256:<hex>`` a ``library`` provenance records for the shared library at ``path``."""
    return _sha256_file(str(Path(path)))

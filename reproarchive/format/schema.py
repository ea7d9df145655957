"""The index of format 1, as typed records, and the one function that reads it (spec §5.1–§8).

Everything an archive says about its content is declared here, once, as plain dataclasses:
storages, values, graph nodes and their arguments, module state, and the record sections
(config, environment, system, failure, source, minify). ``decode_index`` turns the index
member's bytes into an ``Index`` and checks every rule of spec §6–§8 in the order the spec
lists them; code that holds an ``Index`` never re-checks a field or reads a raw map.
``encode_index`` is its mirror and runs the same checks, so a writer cannot produce an index
this reader refuses.

Only rules that are properties of the bytes live here (this layer knows nothing of torch).
What depends on the torch doing the reading — is this call target allowed here, does this
torch know this device type — is checked by ``reproarchive.codec`` when records become torch
objects.

Versioning (spec §10), enforced by ``tests/format/test_schema_version.py`` against
``spec/schema-<major>.<minor>.json``:

* **minor** bump: a new optional field (with a default old readers never need), a new
  optional record key or section, a new member kind that readers may ignore;
* **major** bump: removing or renaming a field, changing a field's type or meaning, a new
  required field, a new storage encoding, a layout change;
* every bump regenerates ``spec/schema-*.json`` and adds golden vectors under the new version
  next to the old ones, which must keep loading.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Union

from reproarchive.errors import IndexSchemaError, LimitExceededError, SchemaViolation, UnsafeArchiveError
from reproarchive.format import index_codec
from reproarchive.format.digests import ALGORITHMS as DIGEST_ALGORITHMS
from reproarchive.format.digests import DIGEST_RE
from reproarchive.format.layout import (
    INDEX_MEMBER,
    LAYOUT_MEMBER,
    MAX_FRAME_SIZE,
    MIN_FRAME_SIZE,
    Limits,
    check_member_name,
    is_blob_name,
)
from reproarchive.format.plain import (
    INT_MAX,
    INT_MIN,
    PlainData,
    Tagged,
    decode,
    decoder_for,
    encode,
)

FORMAT_NAME = "reproarchive"
FORMAT_MAJOR = 1
FORMAT_MINOR = 2
FORMAT_VERSION = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"


def layout_member_bytes(major: int = FORMAT_MAJOR, minor: int = FORMAT_MINOR) -> bytes:
    """The ``reproarchive-layout`` member: the version, readable by people and by ``tar``."""
    return (json.dumps({"format": FORMAT_NAME, "version": f"{major}.{minor}"}, sort_keys=True) + "\n").encode()


IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DEVICE_RE = re.compile(r"^[a-z][a-z0-9_]*(?::[0-9]{1,4})?$")

STAGES = ("compile", "forward", "backward", "accuracy", "crash", "unknown")
FIDELITIES = ("real", "absent")
NODE_OPS = ("placeholder", "get_attr", "call_function", "call_method", "call_module", "output")
COMPUTE_OPS = ("call_function", "call_method", "call_module")
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "jagged")

MAX_RANK = 64
MAX_EXTENT = 1 << 62  # sizes, strides, offsets and element counts stay below this
MAX_VALUE_DEPTH = 32
MAX_GRAPH_DEPTH = 8
MAX_ARG_DEPTH = 32

#: Every storable dtype (spec §6.3): name -> (bytes per element, class). Quantized dtypes are
#: not storable; a name not listed here was written by a newer format minor version.
DTYPES: dict[str, tuple[int, str]] = {
    "bool": (1, "bool"),
    "uint8": (1, "int"), "uint16": (2, "int"), "uint32": (4, "int"), "uint64": (8, "int"),
    "int8": (1, "int"), "int16": (2, "int"), "int32": (4, "int"), "int64": (8, "int"),
    **{f"uint{b}": (1, "int") for b in range(1, 8)},
    **{f"int{b}": (1, "int") for b in range(1, 8)},
    "float16": (2, "float"), "bfloat16": (2, "float"), "float32": (4, "float"), "float64": (8, "float"),
    "float8_e4m3fn": (1, "float"), "float8_e4m3fnuz": (1, "float"), "float8_e5m2": (1, "float"),
    "float8_e5m2fnuz": (1, "float"), "float8_e8m0fnu": (1, "float"), "float4_e2m1fn_x2": (1, "float"),
    "complex32": (4, "complex"), "complex64": (8, "complex"), "complex128": (16, "complex"),
    "bits8": (1, "bits"), "bits16": (2, "bits"), "bits1x8": (1, "bits"), "bits2x4": (1, "bits"),
    "bits4x2": (1, "bits"),
}


def _omit_none(**kw):
    return field(metadata={"omit": "none", **kw}, default=None)


def open_record(cls):
    """A frozen record that also keeps the keys this version does not declare (in ``extra``),
    for informative sections that newer writers may extend (spec §10: readers ignore unknown
    keys, and rewriting an archive keeps them)."""
    cls.__annotations__["extra"] = "dict[str, Any]"
    cls.extra = field(default_factory=dict, metadata={"extra": True})
    return dataclass(frozen=True)(cls)


# --------------------------------------------------------------------------------------------
# §5 container


@dataclass(frozen=True)
class MemberRecord:
    name: str
    size: int
    first_frame: int
    frames: int


@dataclass(frozen=True)
class ContainerRecord:
    frame_size: int
    zstd_level: int | None = None
    zstd_library: str | None = None
    members: tuple[MemberRecord, ...] = ()


# --------------------------------------------------------------------------------------------
# §6.2 storages


@dataclass(frozen=True)
class StorageRecord:
    """One distinct storage. ``digest`` names its blob (real data) unless ``fill`` is 0 (all zero
    bytes, no blob); an ``absent`` storage has neither: the source never had its data."""

    size: int
    device: str
    fidelity: str
    digest: str | None = None
    fill: int | None = None

    @property
    def is_real(self) -> bool:
        return self.fidelity == "real"


# --------------------------------------------------------------------------------------------
# §6.3 values


class _Dim:
    """A symbolic dimension, written as the pair ``[dim, symbol]``."""

    @staticmethod
    def __plain_decode__(v: Any) -> tuple[int, str]:
        if not (isinstance(v, list) and len(v) == 2 and type(v[0]) is int and type(v[1]) is str):
            raise SchemaViolation("expected a [dimension, symbol] pair")
        return (v[0], v[1])

    @staticmethod
    def __plain_encode__(v: tuple[int, str]) -> list:
        return [int(v[0]), str(v[1])]


@dataclass(frozen=True)
class TensorValue:
    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "tensor"
    storage: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    requires_grad: bool
    is_leaf: bool
    dynamic: tuple[_Dim, ...] = ()
    name: str | None = None


@dataclass(frozen=True)
class ScalarValue:
    """``int``, ``float``, ``bool`` or ``str`` with its ``value``, or ``none``."""

    kind: str
    value: PlainData = _omit_none()


@dataclass(frozen=True)
class SymValue:
    """A symbolic ``symint``, ``symfloat`` or ``symbool``: its concrete ``hint`` in the recorded
    run and its ``expr`` (``s0``)."""

    kind: str
    hint: PlainData
    expr: str


@dataclass(frozen=True)
class SequenceValue:
    """A ``tuple`` or ``list`` of value records."""

    kind: str
    items: tuple["Value", ...]


#: The value kinds of spec §6.3 and the Python type a scalar's value / a symbol's hint has.
SCALAR_KINDS = {"int": int, "float": float, "bool": bool, "str": str, "none": type(None)}
SYMBOL_KINDS = {"symint": int, "symfloat": float, "symbool": bool}
Value = Annotated[
    Union[TensorValue, ScalarValue, SymValue, SequenceValue],
    Tagged("kind", {"tensor": TensorValue, "tuple": SequenceValue, "list": SequenceValue,
                    **{k: ScalarValue for k in SCALAR_KINDS}, **{k: SymValue for k in SYMBOL_KINDS}}),
]


def iter_tensors(value: Any):
    """The tensor records inside a value record, depth first."""
    if isinstance(value, TensorValue):
        yield value
    elif isinstance(value, SequenceValue):
        for item in value.items:
            yield from iter_tensors(item)


# --------------------------------------------------------------------------------------------
# §7.2 graph arguments


@dataclass(frozen=True)
class NodeRef:
    name: str


@dataclass(frozen=True)
class TupleArg:
    items: tuple


@dataclass(frozen=True)
class DictArg:
    items: tuple  # (key, value) pairs


@dataclass(frozen=True)
class SliceArg:
    start: Any
    stop: Any
    step: Any


@dataclass(frozen=True)
class ConstantArg:
    """A named torch constant: ``kind`` is ``dtype``, ``device``, ``memory_format`` or ``layout``."""

    kind: str
    name: str


@dataclass(frozen=True)
class EllipsisArg:
    pass


@dataclass(frozen=True)
class ComplexArg:
    real: float
    imag: float


ARG_TYPES = (NodeRef, TupleArg, DictArg, SliceArg, ConstantArg, EllipsisArg, ComplexArg)


def _decode_arg(v: Any, depth: int = 0) -> Any:
    if v is None or type(v) in (bool, float, str):
        return v
    if type(v) is int:
        if not INT_MIN <= v <= INT_MAX:
            raise SchemaViolation(f"integer {v} does not fit in 64 bits")
        return v
    if depth >= MAX_ARG_DEPTH:
        raise SchemaViolation(f"arguments nest deeper than {MAX_ARG_DEPTH} levels")
    if isinstance(v, list):
        return [_decode_arg_at(x, i, depth) for i, x in enumerate(v)]
    if not isinstance(v, dict):
        raise SchemaViolation(f"argument of msgpack type {type(v).__name__} is not allowed")
    k, x = v.get("k"), v.get("v")
    if k == "node" and isinstance(x, str):
        return NodeRef(x)
    if k == "tuple" and isinstance(x, list):
        return TupleArg(tuple(_decode_arg_at(a, i, depth) for i, a in enumerate(x)))
    if k == "dict" and isinstance(x, list) and all(isinstance(p, list) and len(p) == 2 for p in x):
        return DictArg(tuple((_decode_arg_at(a, i, depth), _decode_arg_at(b, i, depth)) for i, (a, b) in enumerate(x)))
    if k == "slice" and isinstance(x, list) and len(x) == 3:
        return SliceArg(*(_decode_arg_at(a, i, depth) for i, a in enumerate(x)))
    if k in ("dtype", "device") and isinstance(x, str) or k == "memory_format" and x in MEMORY_FORMATS \
            or k == "layout" and x in LAYOUTS:
        return ConstantArg(k, x)
    if k == "ellipsis":
        return EllipsisArg()
    if k == "complex" and isinstance(x, list) and len(x) == 2 and all(type(a) in (int, float) for a in x):
        return ComplexArg(float(x[0]), float(x[1]))
    raise SchemaViolation(f"unknown or malformed argument tag {str(k)[:40]!r}")


def _decode_arg_at(v: Any, i: int, depth: int) -> Any:
    try:
        return _decode_arg(v, depth + 1)
    except SchemaViolation as exc:
        raise exc.at(i) from None


def _encode_arg(v: Any) -> Any:
    if v is None or type(v) in (bool, float, str):
        return v
    if type(v) is int:
        if not INT_MIN <= v <= INT_MAX:
            raise SchemaViolation(f"graph constant {v} does not fit in 64 bits")
        return v
    if isinstance(v, list):
        return [_encode_arg(x) for x in v]
    if isinstance(v, NodeRef):
        return {"k": "node", "v": v.name}
    if isinstance(v, TupleArg):
        return {"k": "tuple", "v": [_encode_arg(x) for x in v.items]}
    if isinstance(v, DictArg):
        return {"k": "dict", "v": [[_encode_arg(a), _encode_arg(b)] for a, b in v.items]}
    if isinstance(v, SliceArg):
        return {"k": "slice", "v": [_encode_arg(v.start), _encode_arg(v.stop), _encode_arg(v.step)]}
    if isinstance(v, ConstantArg):
        return {"k": v.kind, "v": v.name}
    if isinstance(v, EllipsisArg):
        return {"k": "ellipsis"}
    if isinstance(v, ComplexArg):
        return {"k": "complex", "v": [v.real, v.imag]}
    raise SchemaViolation(f"graph argument of type {type(v).__name__} cannot be stored")


class Arg:
    """Field type marker for one graph argument (nil, scalars, lists and the tagged maps of §7.2)."""

    __plain_decode__ = staticmethod(_decode_arg)
    __plain_encode__ = staticmethod(_encode_arg)


def iter_arg_values(value: Any):
    """Every argument value inside an argument (itself included), depth first."""
    yield value
    if isinstance(value, (list, tuple)):
        inner = value
    elif isinstance(value, TupleArg):
        inner = value.items
    elif isinstance(value, DictArg):
        inner = [x for pair in value.items for x in pair]
    elif isinstance(value, SliceArg):
        inner = (value.start, value.stop, value.step)
    else:
        return
    for x in inner:
        yield from iter_arg_values(x)


def iter_arg_refs(value: Any):
    """Names of the nodes an argument refers to."""
    for v in iter_arg_values(value):
        if isinstance(v, NodeRef):
            yield v.name


# --------------------------------------------------------------------------------------------
# §7 graph


@dataclass(frozen=True)
class NodeRecord:
    op: str
    name: str
    target: str
    args: tuple[Arg, ...] = ()
    kwargs: dict[str, Arg] = field(default_factory=dict)
    meta: PlainData | None = _omit_none()


@dataclass(frozen=True)
class TensorEntry:
    """A tensor attribute: a ``parameter`` (its requires_grad is the tensor's), a ``buffer``
    (``persistent`` or not) or a plain ``constant``."""

    kind: str
    path: str
    tensor: TensorValue
    persistent: bool | None = _omit_none()


@dataclass(frozen=True)
class SubgraphEntry:
    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "graph"
    path: str
    graph: "GraphRecord"


@dataclass(frozen=True)
class ModuleEntry:
    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "module"
    path: str
    class_name: str = field(metadata={"key": "class"})
    training: bool = False
    attributes: dict[str, Arg] = field(default_factory=dict)


TENSOR_KINDS = ("parameter", "buffer", "constant")
StateEntry = Annotated[
    Union[TensorEntry, SubgraphEntry, ModuleEntry],
    Tagged("kind", {**{k: TensorEntry for k in TENSOR_KINDS}, "graph": SubgraphEntry, "module": ModuleEntry}),
]


@dataclass(frozen=True)
class GraphRecord:
    nodes: tuple[NodeRecord, ...]
    module_state: tuple[StateEntry, ...] = ()

    def placeholders(self) -> list[NodeRecord]:
        return [n for n in self.nodes if n.op == "placeholder"]

    def op_histogram(self) -> dict[str, int]:
        """Compute nodes by target (methods as ``Tensor.<name>``), largest first: what ``inspect``
        shows and what every op count in reproarchive is taken from."""
        histogram: dict[str, int] = {}
        for n in self.nodes:
            if n.op in COMPUTE_OPS:
                key = f"Tensor.{n.target}" if n.op == "call_method" else n.target
                histogram[key] = histogram.get(key, 0) + 1
        return dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])))

    def op_count(self) -> int:
        return sum(1 for n in self.nodes if n.op in COMPUTE_OPS)


# --------------------------------------------------------------------------------------------
# §8 records


@open_record
class CreatedBy:
    reproarchive: str | None = _omit_none()
    torch: str | None = _omit_none()


@dataclass(frozen=True)
class SettingRef:
    module: str
    key: str


@dataclass(frozen=True)
class UnrepresentableSetting:
    """A config value that is not data (a callable, a class, an object): named, never stored."""

    module: str
    key: str
    reason: str = ""
    repr: str = ""
    changed: bool = False


@open_record
class ConfigRecord:
    """The full torch compiler config. ``modules`` holds every setting's value; ``changed`` the
    ones that differed from the default (with ``defaults``); ``types`` restores tuples and sets;
    ``machine_specific`` names values that are paths of the recording machine."""

    modules: dict[str, dict[str, PlainData]] = field(default_factory=dict)
    changed: dict[str, dict[str, PlainData]] = field(default_factory=dict)
    defaults: dict[str, dict[str, PlainData]] = field(default_factory=dict)
    unrepresentable: tuple[UnrepresentableSetting, ...] = ()
    types: dict[str, dict[str, str]] = field(default_factory=dict)
    machine_specific: tuple[SettingRef, ...] = ()


@open_record
class EnvironmentRecord:
    """Variables that steer torch and its libraries; secrets and process-specific values are
    recorded as ``<redacted>`` / ``<process-specific>`` and listed in ``redacted``."""

    variables: dict[str, str] = field(default_factory=dict)
    redacted: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)


def informative(name: str, doc: str, /, **fields: Any) -> type:
    """An open record whose every field is optional: None when the writer did not know it,
    and then left out of the index. What machines report about themselves is like that."""
    specs = [(k, tp | None, _omit_none()) for k, tp in fields.items()]
    specs.append(("extra", dict[str, Any], field(default_factory=dict, metadata={"extra": True})))
    cls = dataclasses.make_dataclass(name, specs, frozen=True)
    cls.__doc__, cls.__module__, cls.__qualname__ = doc, __name__, name
    return cls


TorchInfo = informative("TorchInfo", "The torch build.", version=str, git_version=str, debug=bool, cuda=str,
                        hip=str, xpu=str, num_threads=int)
PythonInfo = informative("PythonInfo", "The Python running torch.", version=str, implementation=str)
OsInfo = informative("OsInfo", "The operating system.", system=str, release=str, platform=str, libc=str)
CpuInfo = informative("CpuInfo", "The CPU, and the vector ISA torch dispatches to.", model=str, machine=str,
                      count=int, usable=int, flags=tuple[str, ...], capability=str)
GpuInfo = informative("GpuInfo", "One GPU.", index=int, name=str, capability=str, total_memory=int,
                      multi_processor_count=int, arch=str, error=str)
CudaInfo = informative("CudaInfo", "CUDA (or HIP) as torch sees it.", available=bool, version=str, cudnn=int,
                       reason=str, driver_version=str, device_count=int, devices=tuple[GpuInfo, ...],
                       arch_list=tuple[str, ...])
CompilerInfo = informative("CompilerInfo", "The C++ compiler inductor's CPU backend calls.", command=str, version=str)
SystemRecord = informative(
    "SystemRecord", "Versions and hardware that take part in compiling and running the graph.",
    torch=TorchInfo, python=PythonInfo, os=OsInfo, cpu=CpuInfo, cuda=CudaInfo, hip=dict[str, PlainData], nvcc=str,
    cxx=CompilerInfo, packages=dict[str, str | None], partial=bool,
)


@open_record
class AccuracyOutput:
    """How one output (or input gradient) compared: the figures behind a pass or fail."""

    index: int | None = _omit_none()
    name: str | None = _omit_none()
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    numel: int | None = _omit_none()
    max_abs_error: float | None = _omit_none()
    max_rel_error: float | None = _omit_none()
    mismatched_elements: int | None = _omit_none()
    worst_index: tuple[int, ...] | None = _omit_none()
    rmse_vs_fp64_eager: float | None = _omit_none()
    rmse_vs_fp64_compiled: float | None = _omit_none()
    passed: bool = False
    rule: str | None = None
    reason: str | None = _omit_none()


@open_record
class AccuracyReport:
    passed: bool
    tolerance: float
    outputs: tuple[AccuracyOutput, ...] = ()
    summary: str = ""
    fp64_reference: str | None = _omit_none()
    fwd_only: bool | None = _omit_none()


@open_record
class FailureRecord:
    """What failed and how; ``signature`` decides "is this the same failure?" (spec §8)."""

    stage: str
    exception_type: str = ""
    message: str = ""
    traceback: str = ""
    signature: str = ""
    backend: str | None = None
    accuracy: AccuracyReport | None = None
    inputs_modified: tuple[int, ...] = field(default=(), metadata={"omit": "empty"})


@open_record
class PassRecord:
    tries: int = 0
    calls: int = 0
    cache_hits: int = 0
    successes: int = 0


@open_record
class ShapeChange:
    recorded: tuple[int, ...] = ()
    now: tuple[int, ...] = ()


@open_record
class DtypeChange:
    recorded: str = ""
    now: str = ""


@open_record
class InputProvenance:
    """(1.1) Where one input of a minified archive came from, and whether it is original data.

    ``origin`` is ``input:<i>`` or ``node:<name>`` of the parent; ``depends_on`` the parent's
    inputs it was computed from; ``values`` what input moves did (``recorded``, ``cropped``,
    ``cast``, ``zeros``, ``ones``, joined by ``+``); ``from_absent`` whether it was computed from
    data the parent did not have. ``real`` sums these up: the values are (a block of) the
    original data. It defaults to False, so a writer that did not say is never read as real."""

    origin: str | None = _omit_none()
    depends_on: tuple[int, ...] = ()
    values: str = "recorded"
    shape: ShapeChange | None = _omit_none()
    dtype: DtypeChange | None = _omit_none()
    from_absent: bool = False
    real: bool = False


MinifyRecord = informative(
    "MinifyRecord",
    "Provenance of a minified archive: what the minifier did, and where each input came from "
    "(``input:<i>`` an input of the parent, ``node:<name>`` a value the parent's graph computed).",
    calls=int, cache_hits=int, accepted=int, oracle_errors=int, initial_ops=int, final_ops=int, initial_nodes=int,
    final_nodes=int, initial_inputs=int, final_inputs=int, rounds=int, elapsed_s=float, stop_reason=str,
    passes=dict[str, PassRecord], wall_s=float, isolate=bool, input_origins=tuple[str, ...],
    initial_input_bytes=int, final_input_bytes=int, jobs=int, order=tuple[str, ...],
    inputs=tuple[InputProvenance, ...], accuracy_mode=str, workers_started=int,
)


# --------------------------------------------------------------------------------------------
# §8 source: where the archive came from, one typed record per kind of source (1.2)


@open_record
class SourceRecord:
    """A source of a kind this version has no record for (a newer writer's, or one written
    before 1.2 without a kind): ``kind`` and ``graph_kind`` (1.1: which of PyTorch's graphs it
    holds) are known, every other key is kept as written."""

    kind: str | None = _omit_none()
    graph_kind: str | None = _omit_none()


@open_record
class CaptureSource:
    """The capture backend caught the failure in the failing process (``reproarchive.capture``,
    ``capture --``). ``written_before_run``: written before the compiled code ran, kept only
    because the process died; ``program_exit`` then says how ``capture --``'s program ended."""

    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "capture"
    kind: ClassVar[str] = "capture"
    graph_kind: ClassVar[str | None] = None  # Dynamo's graph, as a backend receives it
    stage: str | None = _omit_none()
    fwd_only: bool | None = _omit_none()
    tolerance: float | None = _omit_none()
    check_runtime: bool | None = _omit_none()
    written_before_run: bool | None = _omit_none()
    program_exit: int | None = _omit_none()
    replay: dict[str, PlainData] | None = _omit_none()


DUMP_KINDS = ("after_dynamo", "after_aot")


@open_record
class DumpSource:
    """A repro script PyTorch's minifier dumped (``pack``); ``kind`` is the graph it holds,
    ``after_dynamo`` or ``after_aot``. What the script was run with (``run_repro``), where its
    data came from (``content_store``, ``inputs``, ``storages``), what module state had to be
    lifted, and how the one replay that recorded the failure went (``replay``)."""

    kind: str = "after_dynamo"
    script: str | None = _omit_none()
    run_repro: dict[str, PlainData] | None = _omit_none()
    run_repro_non_literal: tuple[str, ...] | None = _omit_none()
    save_dir_found: bool | None = _omit_none()
    content_store: str | None = _omit_none()
    load_args_version: PlainData = _omit_none()
    accuracy_mode: str | None = _omit_none()
    inputs: tuple[dict[str, PlainData], ...] | None = _omit_none()
    storages: dict[str, PlainData] | None = _omit_none()
    lifted_module_state: tuple[dict[str, PlainData], ...] | None = _omit_none()
    printed_module_state: tuple[str, ...] | None = _omit_none()
    environment_origin: str | None = _omit_none()
    replay: dict[str, PlainData] | None = _omit_none()
    torch_version: str | None = _omit_none()
    torch_cuda_version: str | None = _omit_none()
    torch_git_version: str | None = _omit_none()

    def __post_init__(self):
        # read back, another kind would be another record: a writer cannot make one
        if self.kind not in DUMP_KINDS:
            raise SchemaViolation(f"a dump's kind is one of {', '.join(DUMP_KINDS)}, not {str(self.kind)[:40]!r}")

    @property
    def graph_kind(self) -> str:
        return self.kind


@open_record
class TraceSource:
    """One compile of a TORCH_TRACE log (``pack LOG``): which compile (``compile_id``,
    ``attempt``, ``rank``, ``frame``), which artifact the graph came from (``graph_from``) and
    which of PyTorch's graphs that is (``graph_kind``), what the log says of it, and where its
    config, environment and data came from."""

    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "torch_trace"
    kind: ClassVar[str] = "torch_trace"
    compile_id: str | None = _omit_none()
    attempt: int | None = _omit_none()
    rank: int | None = _omit_none()
    frame: PlainData = _omit_none()
    user_stack: PlainData = _omit_none()
    log: str | None = _omit_none()
    trace_format: str | None = _omit_none()
    log_lines: dict[str, PlainData] | None = _omit_none()
    tlparse: dict[str, PlainData] | None = _omit_none()
    graph_from: str | None = _omit_none()
    graph_kind: str | None = _omit_none()
    backend_origin: str | None = _omit_none()
    status: str | None = _omit_none()
    diagnostics: PlainData = _omit_none()
    metrics: dict[str, PlainData] | None = _omit_none()
    cache: PlainData = _omit_none()
    graph_breaks: tuple[str, ...] | None = _omit_none()
    recompile_reasons: tuple[str, ...] | None = _omit_none()
    symbols: PlainData = _omit_none()
    accuracy_from: str | None = _omit_none()
    real_data_from: str | None = _omit_none()
    inputs: PlainData = _omit_none()
    config_origin: str | None = _omit_none()
    environment_origin: str | None = _omit_none()
    replay: dict[str, PlainData] | None = _omit_none()
    lifted_module_state: PlainData = _omit_none()
    storages: PlainData = _omit_none()
    content_store: PlainData = _omit_none()


#: ``source`` is one of these by its ``kind``; any other kind (or none) is a ``SourceRecord``.
Source = Annotated[
    Union[CaptureSource, DumpSource, TraceSource, SourceRecord],
    Tagged("kind", {"capture": CaptureSource, **{k: DumpSource for k in DUMP_KINDS}, "torch_trace": TraceSource},
           SourceRecord),
]


# --------------------------------------------------------------------------------------------
# the records of a repro


@dataclass(frozen=True)
class Records:
    """Everything an archive says around its graph and inputs, as one value: what failed and
    how to replay it (backend, accuracy, config, environment, failure), where it came from
    (source, parent, minify, created_by), the machine (system) and the user's metadata.

    On disk these are top-level keys of the index (§8); in memory they travel together, from
    the capture source that fills them, through the one writer that redacts and packs them, to
    ``Repro.records``. A new record is a field here, its rules in spec §8, and the writer that
    fills it."""

    backend: str | None = None
    accuracy: bool | None = None
    parent: str | None = None
    created_by: CreatedBy | None = None
    config: ConfigRecord | None = None
    environment: EnvironmentRecord | None = None
    system: SystemRecord | None = None
    failure: FailureRecord | None = None
    source: Source | None = None
    minify: MinifyRecord | None = None
    metadata: dict[str, PlainData] | None = None

    @property
    def graph_kind(self) -> str | None:
        """Which of PyTorch's graphs the archive holds, ``after_dynamo`` or ``after_aot`` (it
        decides how Inductor replays it): a dump says so in its kind, a trace import in
        ``source.graph_kind``; a capture holds Dynamo's graph (None)."""
        if self.source is None:
            return None
        return self.source.graph_kind or (self.source.kind if isinstance(self.source, SourceRecord) else None)


# --------------------------------------------------------------------------------------------
# the index


@dataclass(frozen=True)
class Index:
    """The whole index member (spec §6); section order is the order ``decode_index`` checks."""

    container: ContainerRecord
    digest_algorithm: str
    storages: tuple[StorageRecord, ...]
    inputs: tuple[Value, ...]
    graph: GraphRecord
    records: Records = field(default_factory=Records, metadata={"inline": True})
    format: str = FORMAT_NAME
    version: str = FORMAT_VERSION

    def tensor_records(self):
        """Every tensor record: inputs first, then module state (the order storages are numbered)."""
        for value in self.inputs:
            yield from iter_tensors(value)
        yield from _graph_tensors(self.graph)

    def storage_of(self, value: Any) -> StorageRecord:
        return self.storages[value.storage]

    def not_original_inputs(self) -> dict[int, str]:
        """Inputs whose stored bytes are not the original data, by what a minified archive
        records of them (``minify.inputs``, §8): index -> what they are. Their storages are real
        (the bytes exist), so fidelity alone does not say it; every reader that reports
        fidelity reports this too."""
        minify = self.records.minify
        provenance = minify.inputs if minify is not None and minify.inputs else ()
        out = {}
        for i, p in enumerate(provenance[:len(self.inputs)]):
            if p.real:
                continue
            what = "computed from generated data" if p.from_absent else (p.values or "not recorded")
            out[i] = what
        return out


def _graph_tensors(graph: GraphRecord):
    for entry in graph.module_state:
        if isinstance(entry, TensorEntry):
            yield entry.tensor
        elif isinstance(entry, SubgraphEntry):
            yield from _graph_tensors(entry.graph)


# --------------------------------------------------------------------------------------------
# reading and writing


def decode_index(data: bytes, limits: Limits, version: tuple[int, int]) -> Index:
    """Index member bytes -> a checked ``Index``, rules in the order of spec §5.1–§8.

    ``version`` is the footer's (major, minor); the index must agree with it. Raises
    ``IndexSchemaError`` (or ``LimitExceededError``) naming the first rule that fails.
    """
    raw = index_codec.decode_index(data, max_memory=limits.max_index_memory)
    try:
        return _checked(raw, limits, version)
    except SchemaViolation as exc:
        raise IndexSchemaError(f"index field {exc.where} is invalid: {exc.problem}",
                               "the archive is damaged or was written by a broken tool") from None


def encode_index(index: Index, limits: Limits = Limits()) -> bytes:
    """The mirror of ``decode_index``: the same rules, then canonical msgpack (spec §5.1).
    Raises ``SchemaViolation``; ``pack`` reports it as a ``PackError``."""
    raw = encode(index)
    _checked(raw, limits, _parse_version(index.version))
    return index_codec.encode_index(raw)


def to_plain(record: Any) -> Any:
    """A record as plain data (for JSON reports); the inverse is ``from_plain``."""
    return encode(record)


def from_plain(cls: type, raw: Any):
    """A record from plain data, type-checked (``SchemaViolation`` on a mismatch)."""
    return decode(cls, raw)


def _parse_version(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor)


def _checked(raw: Any, caps: Limits, version: tuple[int, int]) -> Index:
    if not isinstance(raw, dict):
        raise SchemaViolation("the index is not a map")
    # §6: format and version
    if raw.get("format") != FORMAT_NAME:
        raise SchemaViolation(f"names format {str(raw.get('format'))[:40]!r}, expected {FORMAT_NAME!r}").at("format")
    if raw.get("version") != f"{version[0]}.{version[1]}":
        raise SchemaViolation("disagrees with the footer's format version").at("version")
    # §5 rule 7: the member list (counts first, before anything is walked)
    container = _section(raw, "container", ContainerRecord)
    if len(container.members) > caps.max_members:
        raise LimitExceededError(f"archive declares {len(container.members)} members, more than the limit {caps.max_members}")
    _check_container(container, caps)
    # §6.1 digests
    algorithm = raw.get("digest_algorithm")
    if algorithm not in DIGEST_ALGORITHMS:
        raise SchemaViolation(f"unknown digest algorithm {str(algorithm)[:20]!r}").at("digest_algorithm")
    # §6.2 storages
    storages = _section(raw, "storages", tuple[StorageRecord, ...])
    if len(storages) > caps.max_members:
        raise LimitExceededError(f"index declares {len(storages)} storages, more than the limit {caps.max_members}")
    _check_storages(storages, container, caps)
    # §6.3 inputs
    inputs = _section(raw, "inputs", tuple[Value, ...])
    if len(inputs) > caps.max_members:
        raise LimitExceededError(f"index declares {len(inputs)} inputs, more than the limit {caps.max_members}")
    for i, value in enumerate(inputs):
        _check_value(value, storages, ("inputs", i), 0)
    # §7 graph (the node count first, before anything is decoded)
    nodes = _raw_node_count(raw.get("graph"), 0)
    if nodes > caps.max_nodes:
        raise LimitExceededError(f"the graph has {nodes} nodes, more than the limit {caps.max_nodes}")
    graph = _section(raw, "graph", GraphRecord)
    _check_graph(graph, storages, ("graph",), 0)
    placeholders = sum(1 for n in graph.nodes if n.op == "placeholder")
    if placeholders != len(inputs):
        raise SchemaViolation(f"the graph has {placeholders} placeholders but the index stores {len(inputs)} inputs").at("inputs")
    # §8 records
    hints = typing.get_type_hints(Records, globals(), include_extras=True)
    records = Records(**{f.name: _section(raw, f.name, hints[f.name]) for f in dataclasses.fields(Records)})
    if records.parent is not None and not DIGEST_RE.match(records.parent):
        raise SchemaViolation("is not <algorithm>:<hex digest>").at("parent")
    if records.failure is not None:
        _check_failure(records.failure)
    return Index(container=container, digest_algorithm=algorithm, storages=storages, inputs=inputs, graph=graph,
                 records=records, format=FORMAT_NAME, version=raw["version"])


def _raw_node_count(graph: Any, depth: int) -> int:
    """Nodes of a graph and its subgraphs as the msgpack decoded them, before any checking
    (a malformed graph counts what it can; the schema names its defect afterwards)."""
    if not isinstance(graph, dict) or depth > MAX_GRAPH_DEPTH:
        return 0
    nodes = graph.get("nodes")
    count = len(nodes) if isinstance(nodes, list) else 0
    state = graph.get("module_state")
    for entry in state if isinstance(state, list) else ():
        if isinstance(entry, dict) and entry.get("kind") == "graph":
            count += _raw_node_count(entry.get("graph"), depth + 1)
    return count


def _section(raw: dict, key: str, tp: Any):
    if key not in raw:
        if _allows_none(tp):
            return None
        raise SchemaViolation("is missing").at(key)
    try:
        return decoder_for(tp)(raw[key])
    except SchemaViolation as exc:
        raise exc.at(key) from None


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType) and type(None) in typing.get_args(tp)


# -- §5 rule 7 -----------------------------------------------------------------------------------

def _check_container(container: ContainerRecord, caps: Limits) -> None:
    if not MIN_FRAME_SIZE <= container.frame_size <= MAX_FRAME_SIZE:
        raise SchemaViolation(f"{container.frame_size} is outside [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE}]").at("frame_size").at("container")
    if not container.members:
        raise SchemaViolation("must list at least the layout member").at("members").at("container")
    seen: set[str] = set()
    total = 0
    for i, m in enumerate(container.members):
        check_member_name(m.name)
        if m.name in seen or m.name == INDEX_MEMBER:
            raise UnsafeArchiveError(f"member {m.name!r} appears twice", "the archive is unsafe or damaged")
        seen.add(m.name)
        for key in ("size", "first_frame", "frames"):
            if getattr(m, key) < 0:
                raise SchemaViolation(f"member {m.name!r} has a negative {key}").at(i).at("members").at("container")
        if m.name.startswith("blobs/") and not is_blob_name(m.name):
            raise SchemaViolation(f"member {m.name!r} is under blobs/ but is not named <algorithm>/<hex digest>").at("container")
        total += m.size
        if total > caps.max_total_bytes:
            raise LimitExceededError(f"members declare more than {caps.max_total_bytes} bytes in total")
    if container.members[0].name != LAYOUT_MEMBER:
        raise SchemaViolation(f"the first member is {container.members[0].name!r}, not {LAYOUT_MEMBER!r}").at("container")


# -- §6.2 ------------------------------------------------------------------------------------------


def _check_storages(storages: tuple[StorageRecord, ...], container: ContainerRecord, caps: Limits) -> None:
    sizes = {m.name: m.size for m in container.members}
    declared = 0
    for i, st in enumerate(storages):
        try:
            if not 0 <= st.size < MAX_EXTENT:
                raise SchemaViolation(f"size {st.size} is negative or impossibly large")
            if not DEVICE_RE.match(st.device):
                raise SchemaViolation(f"{st.device[:40]!r} is not a device name")
            if st.fidelity == "real":
                if (st.digest is None) == (st.fill is None):
                    raise SchemaViolation("a real storage has exactly one of digest or fill")
                if st.fill is not None and st.fill != 0:
                    raise SchemaViolation("fill must be 0")
            elif st.fidelity == "absent":
                if st.digest is not None or st.fill is not None:
                    raise SchemaViolation("an absent storage has neither digest nor fill")
            else:
                raise SchemaViolation(f"fidelity must be 'real' or 'absent', not {st.fidelity[:20]!r}")
            if st.digest is not None:
                m = DIGEST_RE.match(st.digest)
                if not m:
                    raise SchemaViolation(f"malformed digest {st.digest[:80]!r}")
                name = f"blobs/{m.group(1)}/{m.group(2)}"
                if name not in sizes:
                    raise SchemaViolation(f"refers to blob {name}, which the archive does not hold")
                if sizes[name] != st.size:
                    raise SchemaViolation(f"declares {st.size} bytes but blob {name} has {sizes[name]}")
        except SchemaViolation as exc:
            raise exc.at(i).at("storages") from None
        declared += st.size
        if declared > caps.max_total_bytes:
            raise LimitExceededError(f"storages declare more than {caps.max_total_bytes} bytes in total",
                                     "the archive is hostile or damaged")


# -- §6.3 ------------------------------------------------------------------------------------------


def view_extent(shape, stride, offset: int) -> int:
    """Elements of storage a view touches (0 for an empty view)."""
    if any(s == 0 for s in shape):
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _check_value(value: Any, storages, path: tuple, depth: int) -> None:
    if depth > MAX_VALUE_DEPTH:
        raise SchemaViolation(f"values nest deeper than {MAX_VALUE_DEPTH}", path)
    if isinstance(value, TensorValue):
        _check_tensor(value, storages, path)
    elif isinstance(value, ScalarValue):
        _check_kind(value.value, SCALAR_KINDS[value.kind], (*path, "value"))
    elif isinstance(value, SymValue):
        _check_kind(value.hint, SYMBOL_KINDS[value.kind], (*path, "hint"))
    elif isinstance(value, SequenceValue):
        for j, item in enumerate(value.items):
            _check_value(item, storages, (*path, j), depth + 1)


def _check_kind(value: Any, expected: type, path: tuple) -> None:
    """A scalar of the kind its record says (an int stands for a float; a bool never for an int)."""
    ok = type(value) is expected or expected is float and type(value) is int
    if not ok:
        raise SchemaViolation(f"expected {expected.__name__ if expected is not type(None) else 'nil'}, "
                              f"got {type(value).__name__}", path)


def _check_tensor(t: TensorValue, storages, path: tuple) -> None:
    def bad(problem: str):
        return SchemaViolation(problem, path)

    if not 0 <= t.storage < len(storages):
        raise bad(f"storage {t.storage} does not exist")
    info = DTYPES.get(t.dtype)
    if info is None:
        raise bad(f"unknown dtype {t.dtype[:40]!r} (written by a newer reproarchive or torch?)")
    itemsize, klass = info
    if len(t.shape) != len(t.stride) or len(t.shape) > MAX_RANK:
        raise bad(f"shape and stride must have the same rank (at most {MAX_RANK})")
    if any(not 0 <= v < MAX_EXTENT for v in t.shape + t.stride) or not 0 <= t.offset < MAX_EXTENT:
        raise bad("sizes, strides and the offset must be non-negative and below 2^62")
    if math.prod(t.shape) >= MAX_EXTENT:
        raise bad("the view has more elements than a tensor can index")
    need = view_extent(t.shape, t.stride, t.offset) * itemsize
    if need > storages[t.storage].size:
        raise bad(f"the view needs {need} bytes but its storage has {storages[t.storage].size}")
    if not t.is_leaf and not t.requires_grad:
        raise bad("a non-leaf tensor must require grad")
    if t.requires_grad and klass not in ("float", "complex"):
        raise bad("only floating and complex tensors can require grad")
    if not all(0 <= d < len(t.shape) for d, _ in t.dynamic):
        raise bad("a dynamic dimension is out of range")


# -- §7 --------------------------------------------------------------------------------------------

_QUALIFIED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")


def check_attribute_path(path: Any) -> str:
    """get_attr / call_module targets and module-state paths: dotted identifiers, no dunders."""
    ok = isinstance(path, str) and 0 < len(path) <= 500 and all(
        (p.isdigit() or IDENTIFIER_RE.match(p)) and not p.startswith("__") for p in path.split("."))
    if not ok:
        raise UnsafeArchiveError(f"attribute path {str(path)[:120]!r} is malformed",
                                 "the archive is hostile or damaged; refusing to build its graph")
    return path


def _check_graph(graph: GraphRecord, storages, path: tuple, depth: int) -> None:
    if depth > MAX_GRAPH_DEPTH:
        raise SchemaViolation(f"subgraphs nest deeper than {MAX_GRAPH_DEPTH}", path)
    state_paths = set()
    for j, entry in enumerate(graph.module_state):
        check_attribute_path(entry.path)
        if entry.path in state_paths:
            raise SchemaViolation(f"module_state path {entry.path!r} appears twice", (*path, "module_state", j))
        state_paths.add(entry.path)
        if isinstance(entry, TensorEntry):
            _check_tensor(entry.tensor, storages, (*path, "module_state", j, "tensor"))
        elif isinstance(entry, SubgraphEntry):
            _check_graph(entry.graph, storages, (*path, "module_state", j, "graph"), depth + 1)
        elif isinstance(entry, ModuleEntry):
            for key in entry.attributes:
                if key.startswith("__"):
                    raise SchemaViolation(f"module {entry.path!r} has a forbidden attribute {key[:40]!r}",
                                          (*path, "module_state", j))
    defined: set[str] = set()
    outputs = 0
    for i, node in enumerate(graph.nodes):
        where = (*path, "nodes", i)
        if node.op not in NODE_OPS:
            raise SchemaViolation(f"op {node.op[:30]!r} is not an FX op", where)
        if not IDENTIFIER_RE.match(node.name):
            raise SchemaViolation(f"node name {node.name[:60]!r} is not an identifier", where)
        if node.name in defined:
            raise SchemaViolation(f"node name {node.name!r} appears twice", where)
        for key in node.kwargs:
            if not IDENTIFIER_RE.match(key):
                # FX pastes keyword names into the code it generates and execs
                raise UnsafeArchiveError(f"keyword argument name {key[:80]!r} is not an identifier",
                                         "the archive is hostile or damaged; refusing to build its graph")
        for ref in iter_arg_refs(node.args):
            if ref not in defined:
                raise SchemaViolation(f"argument refers to node {ref[:60]!r}, which is not defined before it", where)
        for ref in iter_arg_refs(list(node.kwargs.values())):
            if ref not in defined:
                raise SchemaViolation(f"argument refers to node {ref[:60]!r}, which is not defined before it", where)
        target = node.target
        if node.op == "placeholder":
            if not IDENTIFIER_RE.match(target.removeprefix("**").removeprefix("*")):
                # pasted into the generated ``def forward(...)`` line
                raise UnsafeArchiveError(f"placeholder target {target[:80]!r} is not a parameter name",
                                         "the archive is hostile or damaged; refusing to build its graph")
        elif node.op == "call_function":
            if len(target) > 300 or not _QUALIFIED_RE.match(target) or any(
                    p.startswith("__") for p in target.split(".")[1:]):
                raise UnsafeArchiveError(f"graph calls {target[:120]!r}, which is not a qualified name",
                                         "an archive may only call torch tensor operations; refusing to load it")
        elif node.op == "call_method":
            if not IDENTIFIER_RE.match(target):
                raise UnsafeArchiveError(f"method name {target[:80]!r} is malformed",
                                         "an archive may only call torch tensor operations; refusing to load it")
        elif node.op in ("get_attr", "call_module"):
            check_attribute_path(target)
            if not any(target == p or p.startswith(target + ".") or target.startswith(p + ".") for p in state_paths):
                raise SchemaViolation(f"refers to attribute {target!r}, which module_state lacks", where)
        else:
            outputs += 1
        defined.add(node.name)
    if outputs != 1:
        raise SchemaViolation(f"the graph has {outputs} output nodes, expected exactly one", path)


# -- §8 --------------------------------------------------------------------------------------------


def _check_failure(failure: FailureRecord) -> None:
    if failure.stage not in STAGES:
        raise SchemaViolation(f"stage must be one of {', '.join(STAGES)}").at("stage").at("failure")


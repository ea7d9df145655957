"""The index of format 1 as data: typed records, the closed value sets, the limits (spec §6–§8).

Everything an archive says about its content is declared here, once: storages, values, graph
nodes and their arguments, module state, and the record sections (config, environment,
system, failure, source, minify). This module holds nothing but records (frozen dataclasses),
enums and constants; ``schema_check`` refuses anything else here, so the schema cannot grow
logic. The rules that read and write it (``decode_index``, ``encode_index``, one checker per
spec section, each failure tagged with its rule id) live in ``index_rules``; the converters
between records and plain msgpack data, and the field helpers used below, in ``plain``.

A closed value set is a ``StrEnum``: on disk and in a decoded record it is the member's plain
string; ``schema_check`` describes every set, so a new member needs a version bump.

Versioning (spec §10): a change here needs the version bump ``schema_check`` names (its
docstring has the rules), a new ``spec/schema-<major>.<minor>.json`` and golden vectors next to
the old ones, which must keep loading; ``tests/format/test_schema_version.py`` enforces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Union

from reproarchive.format.plain import ArgCodec, PlainData, Tagged, _Dim, informative, omit_none, open_record

FORMAT_NAME = "reproarchive"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1
FORMAT_VERSION = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"


# -- closed value sets ---------------------------------------------------------------------------


class Stage(StrEnum):
    """Where a failure happened (§8 ``failure.stage``)."""

    (COMPILE, FORWARD, BACKWARD, ACCURACY, CRASH, UNKNOWN) = (
        "compile", "forward", "backward", "accuracy", "crash", "unknown")


class Fidelity(StrEnum):
    """Whether a storage's bytes are the original data (§6.2)."""

    REAL, ABSENT = "real", "absent"


class DigestAlgorithm(StrEnum):
    """Blob digest algorithms (§6.1)."""

    SHA256, BLAKE3 = "sha256", "blake3"


class NodeOp(StrEnum):
    """FX node ops (§7.1)."""

    (PLACEHOLDER, GET_ATTR, CALL_FUNCTION, CALL_METHOD, CALL_MODULE, OUTPUT) = (
        "placeholder", "get_attr", "call_function", "call_method", "call_module", "output")


class ArgTag(StrEnum):
    """The tags ``k`` of a tagged argument map (§7.2)."""

    (NODE, TUPLE, DICT, SLICE, DTYPE, DEVICE, MEMORY_FORMAT, LAYOUT, ELLIPSIS, COMPLEX) = (
        "node", "tuple", "dict", "slice", "dtype", "device", "memory_format", "layout", "ellipsis", "complex")


class ConstantKind(StrEnum):
    """The named torch constants an argument may hold (a subset of ``ArgTag``)."""

    DTYPE, DEVICE, MEMORY_FORMAT, LAYOUT = "dtype", "device", "memory_format", "layout"


class MemoryFormat(StrEnum):
    """``torch.memory_format`` names (§7.2)."""

    (CONTIGUOUS_FORMAT, CHANNELS_LAST, CHANNELS_LAST_3D, PRESERVE_FORMAT) = (
        "contiguous_format", "channels_last", "channels_last_3d", "preserve_format")


class Layout(StrEnum):
    """``torch.layout`` names (§7.2)."""

    STRIDED, SPARSE_COO, SPARSE_CSR, JAGGED = "strided", "sparse_coo", "sparse_csr", "jagged"


class TensorKind(StrEnum):
    """Module-state entries that hold a tensor (§7.4)."""

    PARAMETER, BUFFER, CONSTANT = "parameter", "buffer", "constant"


class GraphKind(StrEnum):
    """Which of PyTorch's graphs an archive holds (§8 ``source.kind`` / ``source.graph_kind``)."""

    AFTER_DYNAMO, AFTER_AOT = "after_dynamo", "after_aot"


class CallRoot(StrEnum):
    """The modules a call target's name is resolved from (§7.3)."""

    TORCH, OPERATOR, MATH, BUILTINS = "torch", "operator", "math", "builtins"


# -- constants -----------------------------------------------------------------------------------

#: Node ops that compute (what op counts and histograms count).
COMPUTE_OPS = (NodeOp.CALL_FUNCTION, NodeOp.CALL_METHOD, NodeOp.CALL_MODULE)

#: Limits of the format (a reader's adjustable caps are ``layout.Limits``).
MAX_RANK = 64
MAX_EXTENT = 1 << 62  # sizes, strides, offsets and element counts stay below this
MAX_VALUE_DEPTH = 32
MAX_GRAPH_DEPTH = 8
MAX_TARGET_LENGTH = 300
MAX_ATTRIBUTE_PATH_LENGTH = 500

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

#: The value kinds of spec §6.3 and the Python type a scalar's value / a symbol's hint has.
SCALAR_KINDS = {"int": int, "float": float, "bool": bool, "str": str, "none": type(None)}
SYMBOL_KINDS = {"symint": int, "symfloat": float, "symbool": bool}


# -- §5 container --------------------------------------------------------------------------------


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


# -- §6.2 storages -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StorageRecord:
    """One distinct storage. ``digest`` names its blob (real data) unless ``fill`` is 0 (all zero
    bytes, no blob); an ``absent`` storage has neither: the source never had its data."""

    size: int
    device: str
    fidelity: Fidelity
    digest: str | None = None
    fill: int | None = None

    @property
    def is_real(self) -> bool:
        return self.fidelity == "real"


# -- §6.3 values ---------------------------------------------------------------------------------


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

    def tensors(self):
        yield self


@dataclass(frozen=True)
class ScalarValue:
    """``int``, ``float``, ``bool`` or ``str`` with its ``value``, or ``none``."""

    kind: str
    value: PlainData = omit_none()

    def tensors(self):
        return iter(())


@dataclass(frozen=True)
class SymValue:
    """A symbolic ``symint``, ``symfloat`` or ``symbool``: its recorded ``hint`` and ``expr`` (``s0``)."""

    kind: str
    hint: PlainData
    expr: str

    def tensors(self):
        return iter(())


@dataclass(frozen=True)
class SequenceValue:
    """A ``tuple`` or ``list`` of value records."""

    kind: str
    items: tuple["Value", ...]

    def tensors(self):  # the tensor records inside, depth first
        for item in self.items:
            yield from item.tensors()


Value = Annotated[
    Union[TensorValue, ScalarValue, SymValue, SequenceValue],
    Tagged("kind", {"tensor": TensorValue, "tuple": SequenceValue, "list": SequenceValue,
                    **{k: ScalarValue for k in SCALAR_KINDS}, **{k: SymValue for k in SYMBOL_KINDS}}),
]


# -- §7.2 graph arguments ------------------------------------------------------------------------


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

    kind: ConstantKind
    name: str


@dataclass(frozen=True)
class EllipsisArg:
    pass


@dataclass(frozen=True)
class ComplexArg:
    real: float
    imag: float


#: One graph argument: nil, bool, int64, float, str, a list of arguments, or one of the records above.
Arg = Annotated[Any, ArgCodec(node=NodeRef, tuple=TupleArg, dict=DictArg, slice=SliceArg, constant=ConstantArg,
                              ellipsis=EllipsisArg, complex=ComplexArg,
                              constants={ConstantKind.DTYPE: None, ConstantKind.DEVICE: None,
                                         ConstantKind.MEMORY_FORMAT: MemoryFormat, ConstantKind.LAYOUT: Layout})]


# -- §7 graph ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRecord:
    op: NodeOp
    name: str
    target: str
    args: tuple[Arg, ...] = ()
    kwargs: dict[str, Arg] = field(default_factory=dict)
    meta: PlainData | None = omit_none()


@dataclass(frozen=True)
class TensorEntry:
    """A tensor attribute: a ``parameter`` (its requires_grad is the tensor's), a ``buffer``
    (``persistent`` or not) or a plain ``constant``."""

    kind: TensorKind
    path: str
    tensor: TensorValue
    persistent: bool | None = omit_none()


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


StateEntry = Annotated[
    Union[TensorEntry, SubgraphEntry, ModuleEntry],
    Tagged("kind", {**{k.value: TensorEntry for k in TensorKind}, "graph": SubgraphEntry, "module": ModuleEntry}),
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

    def tensors(self):
        """The tensor records of module state, subgraphs included."""
        for entry in self.module_state:
            if isinstance(entry, TensorEntry):
                yield entry.tensor
            elif isinstance(entry, SubgraphEntry):
                yield from entry.graph.tensors()


# -- §8 records ----------------------------------------------------------------------------------


@open_record
class CreatedBy:
    reproarchive: str | None = omit_none()
    torch: str | None = omit_none()


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


TorchInfo = informative("TorchInfo", "The torch build.", __name__, version=str, git_version=str, debug=bool, cuda=str,
                        hip=str, xpu=str, num_threads=int)
PythonInfo = informative("PythonInfo", "The Python running torch.", __name__, version=str, implementation=str)
OsInfo = informative("OsInfo", "The operating system.", __name__, system=str, release=str, platform=str, libc=str)
CpuInfo = informative("CpuInfo", "The CPU, and the vector ISA torch dispatches to.", __name__, model=str, machine=str,
                      count=int, usable=int, flags=tuple[str, ...], capability=str)
GpuInfo = informative("GpuInfo", "One GPU.", __name__, index=int, name=str, capability=str, total_memory=int,
                      multi_processor_count=int, arch=str, error=str)
CudaInfo = informative("CudaInfo", "CUDA (or HIP) as torch sees it.", __name__, available=bool, version=str, cudnn=int,
                       reason=str, driver_version=str, device_count=int, devices=tuple[GpuInfo, ...],
                       arch_list=tuple[str, ...])
CompilerInfo = informative("CompilerInfo", "The C++ compiler inductor's CPU backend calls.", __name__, command=str, version=str)
SystemRecord = informative(
    "SystemRecord", "Versions and hardware that take part in compiling and running the graph.", __name__,
    torch=TorchInfo, python=PythonInfo, os=OsInfo, cpu=CpuInfo, cuda=CudaInfo, hip=dict[str, PlainData], nvcc=str,
    cxx=CompilerInfo, packages=dict[str, str | None], partial=bool,
)


@open_record
class AccuracyOutput:
    """How one output (or input gradient) compared: the figures behind a pass or fail."""

    index: int | None = omit_none()
    name: str | None = omit_none()
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    numel: int | None = omit_none()
    max_abs_error: float | None = omit_none()
    max_rel_error: float | None = omit_none()
    mismatched_elements: int | None = omit_none()
    worst_index: tuple[int, ...] | None = omit_none()
    rmse_vs_fp64_eager: float | None = omit_none()
    rmse_vs_fp64_compiled: float | None = omit_none()
    passed: bool = False
    rule: str | None = None
    reason: str | None = omit_none()


@open_record
class AccuracyReport:
    passed: bool
    tolerance: float
    outputs: tuple[AccuracyOutput, ...] = ()
    summary: str = ""
    fp64_reference: str | None = omit_none()
    fwd_only: bool | None = omit_none()


@open_record
class FailureRecord:
    """What failed and how; ``signature`` decides "is this the same failure?" (spec §8)."""

    stage: Stage
    exception_type: str = ""
    message: str = ""
    traceback: str = ""
    signature: str = ""
    backend: str | None = None
    accuracy: AccuracyReport | None = None
    inputs_modified: tuple[int, ...] = field(default=(), metadata={"omit": "empty"})


@open_record
class SourceRecord:
    """Where the archive came from (``kind``: capture, after_dynamo, after_aot, torch_trace ...);
    ``graph_kind`` (1.1) says which of PyTorch's graphs it holds when ``kind`` does not; the rest
    is informative and depends on the kind."""

    kind: str | None = omit_none()
    graph_kind: str | None = omit_none()


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

    origin: str | None = omit_none()
    depends_on: tuple[int, ...] = ()
    values: str = "recorded"
    shape: ShapeChange | None = omit_none()
    dtype: DtypeChange | None = omit_none()
    from_absent: bool = False
    real: bool = False


MinifyRecord = informative(
    "MinifyRecord",
    "Provenance of a minified archive: what the minifier did, and where each input came from "
    "(``input:<i>`` an input of the parent, ``node:<name>`` a value the parent's graph computed).", __name__,
    calls=int, cache_hits=int, accepted=int, oracle_errors=int, initial_ops=int, final_ops=int, initial_nodes=int,
    final_nodes=int, initial_inputs=int, final_inputs=int, rounds=int, elapsed_s=float, stop_reason=str,
    passes=dict[str, PassRecord], wall_s=float, isolate=bool, input_origins=tuple[str, ...],
    initial_input_bytes=int, final_input_bytes=int, jobs=int, order=tuple[str, ...],
    inputs=tuple[InputProvenance, ...], accuracy_mode=str, workers_started=int,
)


# -- the index -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Index:
    """The whole index member (spec §6); section order is the order ``decode_index`` checks."""

    container: ContainerRecord
    digest_algorithm: DigestAlgorithm
    storages: tuple[StorageRecord, ...]
    inputs: tuple[Value, ...]
    graph: GraphRecord
    backend: str | None = None
    accuracy: bool | None = None
    parent: str | None = None
    created_by: CreatedBy | None = None
    config: ConfigRecord | None = None
    environment: EnvironmentRecord | None = None
    system: SystemRecord | None = None
    failure: FailureRecord | None = None
    source: SourceRecord | None = None
    minify: MinifyRecord | None = None
    metadata: dict[str, PlainData] | None = None
    format: str = FORMAT_NAME
    version: str = FORMAT_VERSION

    @property
    def graph_kind(self) -> str | None:
        """Which ``GraphKind`` the archive holds (it decides how Inductor replays it): a dump
        import says so in ``source.kind``, a trace import in ``source.graph_kind``."""
        if self.source is None:
            return None
        return self.source.graph_kind or self.source.kind

    def tensor_records(self):
        """Every tensor record: inputs first, then module state (the order storages are numbered)."""
        for value in self.inputs:
            yield from value.tensors()
        yield from self.graph.tensors()

    def storage_of(self, value: Any) -> StorageRecord:
        return self.storages[value.storage]

    def not_original_inputs(self) -> dict[int, str]:
        """Inputs whose stored bytes are not the original data, by what a minified archive
        records of them (``minify.inputs``, §8): index -> what they are. Their storages are real
        (the bytes exist), so fidelity alone does not say it; every reader that reports
        fidelity reports this too."""
        provenance = self.minify.inputs if self.minify is not None and self.minify.inputs else ()
        out = {}
        for i, p in enumerate(provenance[:len(self.inputs)]):
            if p.real:
                continue
            what = "computed from generated data" if p.from_absent else (p.values or "not recorded")
            out[i] = what
        return out

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
the old ones, which must keep loading (``python -m reproarchive.spec_files --write`` makes them);
``tests/format/test_schema_version.py`` enforces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Union

from reproarchive.format.plain import ArgCodec, PlainData, Tagged, _Dim, omit_none, open_record
from reproarchive.format.schema_records import (  # noqa: F401 - the schema's names are one namespace
    DUMP_KINDS,
    AccuracyOutput,
    AccuracyReport,
    AutocastState,
    CaptureSource,
    CompilerInfo,
    ConfigRecord,
    CpuInfo,
    CreatedBy,
    CudaInfo,
    DtypeChange,
    DumpSource,
    EnvironmentRecord,
    ExecutionRecord,
    FailureRecord,
    GeneratorState,
    GpuInfo,
    InputProvenance,
    MinifyRecord,
    OsInfo,
    PassRecord,
    PythonInfo,
    Records,
    RngRecord,
    SettingRef,
    ShapeChange,
    ShapeDim,
    ShapeInput,
    ShapePolicy,
    ShapeSymbol,
    Source,
    SourceRecord,
    SystemRecord,
    TorchInfo,
    TraceSource,
    UnrepresentableSetting,
)
from reproarchive.format.schema_sets import (  # noqa: F401 - the schema's names are one namespace
    COMPUTE_OPS,
    DERIVED_KINDS,
    DTYPES,
    MAX_ATTRIBUTE_PATH_LENGTH,
    MAX_EXTENT,
    MAX_GRAPH_DEPTH,
    MAX_RANK,
    MAX_TARGET_LENGTH,
    MAX_VALUE_DEPTH,
    SCALAR_KINDS,
    SHAPE_DIM_KINDS,
    SHAPE_INPUT_KINDS,
    SYMBOL_KINDS,
    ArgTag,
    CallRoot,
    ConstantKind,
    DigestAlgorithm,
    Fidelity,
    GraphKind,
    Layout,
    MemoryFormat,
    NodeOp,
    PlacementKind,
    RankStatus,
    Stage,
    TensorKind,
)

FORMAT_NAME = "reproarchive"
FORMAT_MAJOR = 1
FORMAT_MINOR = 5
FORMAT_VERSION = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"


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


@dataclass(frozen=True)
class SubclassValue:
    """(1.3) A traceable tensor subclass (``TwoTensor``, a nested jagged tensor) as its flatten
    protocol gives it: ``cls`` its qualified class name, ``attrs`` the inner tensors' attribute
    names and ``items`` their values, ``context`` its plain-data context, ``size``/``stride`` the
    outer geometry as text (a nested jagged tensor's ragged size is a symbol, ``j1``)."""

    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "subclass"
    cls: str
    attrs: tuple[str, ...]
    items: tuple["Value", ...]
    context: PlainData
    size: tuple[str, ...]
    stride: tuple[str, ...]
    requires_grad: bool
    name: str | None = None

    @property
    def kind(self) -> str:
        return self.TAG

    def tensors(self):
        for item in self.items:
            yield from item.tensors()


@dataclass(frozen=True)
class DerivedValue:
    """(1.3) An input that is a size (``kind`` ``size``) or stride (``stride``) of another
    input: ``input`` indexes the index's ``inputs`` (a tensor or subclass), ``dim`` one of its
    dimensions, ``expr`` the symbol the recording named it (``s21``; informative). What Dynamo
    passes next to a nested jagged tensor: its ragged size is a nested int (``j1``) that exists
    only as a property of that tensor, so a loader computes it from the rebuilt input."""

    kind: str
    input: int
    dim: int
    expr: str | None = omit_none()

    def tensors(self):
        return iter(())


Value = Annotated[
    Union[TensorValue, ScalarValue, SymValue, SequenceValue, SubclassValue, DerivedValue],
    Tagged("kind", {"tensor": TensorValue, "tuple": SequenceValue, "list": SequenceValue, "subclass": SubclassValue,
                    **{k: ScalarValue for k in SCALAR_KINDS}, **{k: SymValue for k in SYMBOL_KINDS},
                    **{k: DerivedValue for k in DERIVED_KINDS}}),
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
                                         ConstantKind.MEMORY_FORMAT: MemoryFormat, ConstantKind.LAYOUT: Layout,
                                         ConstantKind.OPERATOR: None})]


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


# -- §8 job: the ranks of a multi-rank job (1.3) ------------------------------------------------


@open_record
class ProcessGroupRecord:
    """One process group as torch.distributed named it: ``name`` (what a graph's collectives
    pass, ``group_name``), its members as global ``ranks`` (in group-rank order), ``backend``
    (``gloo``, ``nccl``), ``index`` (creation order: a replay creates groups in this order, so
    counter names come out the same), ``desc`` (torch's ``group_desc``) and, for a DeviceMesh
    dimension's group, that dimension's name (``mesh_dim``)."""

    name: str
    ranks: tuple[int, ...]
    backend: str | None = omit_none()
    index: int | None = omit_none()
    desc: str | None = omit_none()
    mesh_dim: str | None = omit_none()


@open_record
class MeshRecord:
    """A DeviceMesh: ``shape``, its global ``ranks`` in row-major order, ``dim_names`` and
    ``device_type``; each dimension's groups are the table's groups with that ``mesh_dim``."""

    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    dim_names: tuple[str, ...] | None = omit_none()
    device_type: str | None = omit_none()


@open_record
class PlacementRecord:
    """A DTensor placement along one mesh dimension: ``shard`` (``dim``), ``replicate`` or
    ``partial`` (``reduce_op``)."""

    kind: PlacementKind
    dim: int | None = omit_none()
    reduce_op: str | None = omit_none()


@open_record
class DTensorInput:
    """A rank's input that was a DTensor: the stored tensor is its local shard; ``mesh`` is an
    index into ``job.meshes``, one placement per mesh dimension, and the global ``shape`` and
    ``stride``."""

    input: int
    mesh: int
    placements: tuple[PlacementRecord, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@open_record
class CollectiveRecord:
    """One collective a rank's graph issues, in graph order: the operator (``all_reduce``),
    the group's recorded name, the tensors it sends (shapes and dtypes), the compile it belongs
    to and the node that calls it."""

    op: str
    group: str | None = omit_none()
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    compile_id: str | None = omit_none()
    node: str | None = omit_none()


@open_record
class CompileRecord:
    """One compile on a rank, in order: Dynamo's compile id, why it recompiled, cache hit or miss."""

    compile_id: str
    recompile_reasons: tuple[str, ...] = ()
    cache: str | None = omit_none()


@open_record
class RankOutcome:
    """How a rank ended (``status``), its failure record when it failed (or timed out), the
    signal or exit code of a crash, and what it was doing (``doing``: the collective it waited
    in, the graph it ran)."""

    status: RankStatus
    failure: FailureRecord | None = omit_none()
    signal: str | None = omit_none()
    exit_code: int | None = omit_none()
    doing: str | None = omit_none()


@open_record
class RankRecord:
    """One rank. ``graph`` absent: the index's own ``graph``; else an index into ``job.graphs``.
    ``inputs`` absent: the index's own ``inputs``; else this rank's, whose tensors point into the
    one storage table. ``records`` (1.5) absent: the index's own records (config, environment,
    system, execution state, shape policy, RNG ...) are this rank's too; else an index into
    ``job.records``, this rank's own. ``host`` is a digest of the host name, never the name."""

    rank: int
    local_rank: int | None = omit_none()
    device: str | None = omit_none()
    host: str | None = omit_none()
    graph: int | None = omit_none()
    inputs: tuple[Value, ...] | None = omit_none()
    dtensors: tuple[DTensorInput, ...] = field(default=(), metadata={"omit": "empty"})
    schedule: tuple[CollectiveRecord, ...] = ()
    compiles: tuple[CompileRecord, ...] = field(default=(), metadata={"omit": "empty"})
    outcome: RankOutcome | None = omit_none()
    records: int | None = omit_none()  # (1.5)


@open_record
class JobRecord:
    """(1.3) A multi-rank job: the index's own graph and inputs are rank ``primary_rank``'s (the
    failing rank, else rank 0), so a single-process reader sees a valid archive; ``ranks`` holds
    every rank recorded, ``graphs`` the distinct graphs that are not the index's own, ``records``
    (1.5) the distinct records of ranks whose records are not the index's own (each stored once,
    however many ranks share it; a rank's failure is in its ``outcome``, not here)."""

    world_size: int
    primary_rank: int
    backend: str | None = omit_none()
    failing_rank: int | None = omit_none()
    groups: tuple[ProcessGroupRecord, ...] = ()
    meshes: tuple[MeshRecord, ...] = field(default=(), metadata={"omit": "empty"})
    graphs: tuple[GraphRecord, ...] = field(default=(), metadata={"omit": "empty"})
    ranks: tuple[RankRecord, ...] = ()
    records: tuple[Records, ...] = field(default=(), metadata={"omit": "empty"})  # (1.5)


# --------------------------------------------------------------------------------------------
# §8 custom ops (1.3): operators of libraries outside torch, as data


@open_record
class OpProvenance:
    """(1.3) Where a custom op's implementation came from, so a replaying machine can tell
    whether it has the same one: ``kind`` ``python`` (``module`` and ``digest``: the sha256 of
    the defining function's source), ``library`` (``library``: the shared library's file name,
    never its path, and ``digest``: the file's sha256) or ``unknown``."""

    kind: str = "unknown"
    module: str | None = omit_none()
    library: str | None = omit_none()
    digest: str | None = omit_none()


@dataclass(frozen=True)
class CustomOpCall:
    """(1.3) One call of a custom op in the failing run: each schema argument by content
    (``arguments``: a tensor as ``<dtype>[<shape>] <digest of its contiguous bytes>``, any
    other argument as its plain value) and the op's real outputs, as value records whose
    tensors are storages of the table (deduplicated like any storage)."""

    arguments: tuple[PlainData, ...] = ()
    outputs: tuple[Value, ...] = ()


@dataclass(frozen=True)
class CustomOpRecord:
    """(1.3) An operator of the graph that is not torch's own: ``name`` (``ns::op.overload``),
    its ``schema`` as torch prints it, the dispatch keys it had kernels for, whether it had a
    fake (meta) implementation, where its implementation came from, and its calls in the
    failing run (none when the source could not run it on real data)."""

    name: str
    schema: str
    dispatch_keys: tuple[str, ...] = ()
    fake: bool = False
    provenance: OpProvenance | None = omit_none()
    calls: tuple[CustomOpCall, ...] = ()

    def tensors(self):
        for call in self.calls:
            for value in call.outputs:
                yield from value.tensors()


@dataclass(frozen=True)
class TritonConfig:
    """(1.4) One autotuning configuration of a user Triton kernel, as data: its meta-parameters
    and launch options. Informative: a reader never compiles or launches anything from it; a
    kernel the user brings is bound only when its configurations equal these."""

    kwargs: dict[str, PlainData] = field(default_factory=dict)
    num_warps: int | None = omit_none()
    num_stages: int | None = omit_none()
    num_ctas: int | None = omit_none()


@dataclass(frozen=True)
class TritonCall:
    """(1.4) One launch of a user Triton kernel in the failing run: which ``constants`` entry of
    its record it used, each tensor argument before the launch by content (``arguments``: name ->
    ``<dtype>[<shape>] <digest>``, as custom-op calls key them) and the tensors the launch changed,
    as they were after it (``written``: name -> value record over the storage table)."""

    constants: int
    arguments: dict[str, str] = field(default_factory=dict)
    written: dict[str, Value] = field(default_factory=dict)


@dataclass(frozen=True)
class TritonKernelRecord:
    """(1.4) A user Triton kernel the graph launches (``triton_kernel_wrapper_mutation`` /
    ``_functional`` with ``kernel_idx`` = ``index``): its source as data with the digest that
    identifies it, its parameters, constexprs and autotuning configurations, the non-tensor
    arguments of each call site (``constants``, named by the nodes' ``constant_args_idx``) and
    its launches in the failing run. The source is never compiled from the archive (spec §9)."""

    index: int
    name: str
    source: str
    digest: str
    arg_names: tuple[str, ...] = ()
    constexprs: tuple[str, ...] = ()
    module: str | None = omit_none()
    configs: tuple[TritonConfig, ...] = ()
    autotune_key: tuple[str, ...] = ()
    constants: tuple[dict[str, PlainData], ...] = ()
    calls: tuple[TritonCall, ...] = ()

    def tensors(self):
        for call in self.calls:
            for value in call.written.values():
                yield from value.tensors()


# --------------------------------------------------------------------------------------------
# the index


@dataclass(frozen=True)
class Index:
    """The whole index member (spec §6); section order is the order ``decode_index`` checks."""

    container: ContainerRecord
    digest_algorithm: DigestAlgorithm
    storages: tuple[StorageRecord, ...]
    inputs: tuple[Value, ...]
    graph: GraphRecord
    records: Records = field(default_factory=Records, metadata={"inline": True})
    format: str = FORMAT_NAME
    version: str = FORMAT_VERSION
    job: JobRecord | None = omit_none()  # (1.3) absent for a single-process archive
    custom_ops: tuple[CustomOpRecord, ...] | None = omit_none()  # (1.3) absent, not nil, when none
    triton_kernels: tuple[TritonKernelRecord, ...] | None = omit_none()  # (1.4) absent, not nil, when none

    def tensor_records(self):
        """Every tensor record: inputs first, then module state, then the recorded outputs of
        custom ops, then what Triton kernels wrote (the order storages are numbered)."""
        for value in self.inputs:
            yield from value.tensors()
        yield from self.graph.tensors()
        for op in self.custom_ops or ():
            yield from op.tensors()
        for kernel in self.triton_kernels or ():
            yield from kernel.tensors()

    def job_tensor_records(self):
        """The tensor records of the other ranks (§8 ``job``): their inputs, then their graphs'."""
        if self.job is None:
            return
        for rank in self.job.ranks:
            for value in rank.inputs or ():
                yield from value.tensors()
        for graph in self.job.graphs:
            yield from graph.tensors()

    def storage_of(self, value: Any) -> StorageRecord:
        return self.storages[value.storage]

    def not_original_inputs(self, records: Records | None = None, inputs: tuple | None = None) -> dict[int, str]:
        """Inputs whose stored bytes are not the original data, by what a minified archive
        records of them (``minify.inputs``, §8): index -> what they are. Their storages are real
        (the bytes exist), so fidelity alone does not say it; every reader that reports
        fidelity reports this too. ``records``/``inputs``: a rank's of a job (default: the index's)."""
        minify = (records or self.records).minify
        provenance = minify.inputs if minify is not None and minify.inputs else ()
        out = {}
        for i, p in enumerate(provenance[:len(self.inputs if inputs is None else inputs)]):
            if p.real:
                continue
            what = "computed from generated data" if p.from_absent else (p.values or "not recorded")
            out[i] = what
        return out

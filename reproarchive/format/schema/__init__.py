"""The index of format 1 as data: typed records, the closed value sets, the limits (spec §6–§8).

Everything an archive says about its content is declared in this package, once, one module per
part of the index:

* ``version``: the format's name and ``FORMAT_VERSION``;
* ``sets``: the closed value sets (``StrEnum``) and the limits;
* ``values``: storages (§6.2) and values (§6.3), the ``Value`` union;
* ``graph``: graph nodes, their arguments (§7.2) and module state (§7);
* ``sections``: the record sections around a graph (§8: config, environment, system, failure,
  execution state, shapes, RNG, source, minify) and ``Records``, which carries them all;
* ``job``: the ranks of a multi-rank job (§8 ``job``);
* ``custom_ops``: custom ops and user Triton kernels as data (§8);
* ``index``: the member list (§5) and ``Index``, which holds all of the above.

Those modules hold nothing but records (frozen dataclasses), enums and constants;
``schema_check`` refuses anything else in them, so the schema cannot grow logic. This package
re-exports every name: readers import them from ``reproarchive.format.schema``. The rules that
read and write it (``decode_index``, ``encode_index``, one checker per spec section, each
failure tagged with its rule id) live in ``schema.rules``; the converters between records and
plain msgpack data, and the field helpers used here, in ``plain``.

A closed value set is a ``StrEnum``: on disk and in a decoded record it is the member's plain
string; ``schema_check`` describes every set, so a new member needs a version bump.

Versioning (spec §10): a change here needs the version bump ``schema_check`` names (its
docstring has the rules), a new ``spec/schema-<major>.<minor>.json`` and golden vectors next to
the old ones, which must keep loading (``python -m reproarchive.spec_files --write`` makes them);
``tests/format/test_schema_version.py`` enforces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field  # noqa: F401 - the names the records' field types are resolved in
from typing import Annotated, Any, ClassVar, Union  # noqa: F401

from reproarchive.format.plain import ArgCodec, PlainData, Tagged, _Dim, omit_none, open_record  # noqa: F401
from reproarchive.format.schema.custom_ops import (  # noqa: F401 - the schema's names are one namespace
    CustomOpCall,
    CustomOpRecord,
    OpProvenance,
    TritonCall,
    TritonConfig,
    TritonKernelRecord,
)
from reproarchive.format.schema.graph import (  # noqa: F401 - the schema's names are one namespace
    Arg,
    ComplexArg,
    ConstantArg,
    DictArg,
    EllipsisArg,
    GraphRecord,
    ModuleEntry,
    NodeRecord,
    NodeRef,
    SliceArg,
    StackFrame,
    StateEntry,
    SubgraphEntry,
    TensorEntry,
    TupleArg,
)
from reproarchive.format.schema.index import (  # noqa: F401 - the schema's names are one namespace
    ContainerRecord,
    Index,
    MemberRecord,
)
from reproarchive.format.schema.job import (  # noqa: F401 - the schema's names are one namespace
    FAKE_PROCESS_GROUP,
    CollectiveRecord,
    CompileRecord,
    DTensorInput,
    JobRecord,
    MeshRecord,
    PlacementRecord,
    ProcessGroupRecord,
    RankOutcome,
    RankRecord,
)
from reproarchive.format.schema.sections import (  # noqa: F401 - the schema's names are one namespace
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
    ShapeEntry,
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
from reproarchive.format.schema.sets import (  # noqa: F401 - the schema's names are one namespace
    COMPUTE_OPS,
    DERIVED_KINDS,
    DTYPES,
    MAX_ATTRIBUTE_PATH_LENGTH,
    MAX_EXTENT,
    MAX_FRAME_TEXT,
    MAX_GRAPH_DEPTH,
    MAX_RANK,
    MAX_STACK_FRAMES,
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
from reproarchive.format.schema.values import (  # noqa: F401 - the schema's names are one namespace
    DerivedValue,
    ScalarValue,
    SequenceValue,
    StorageRecord,
    SubclassValue,
    SymValue,
    TensorValue,
    Value,
)
from reproarchive.format.schema.version import (  # noqa: F401 - the schema's names are one namespace
    FORMAT_MAJOR,
    FORMAT_MINOR,
    FORMAT_NAME,
    FORMAT_VERSION,
)

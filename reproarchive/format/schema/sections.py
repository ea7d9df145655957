"""The records around a graph (spec §8), part of the schema: config, environment, system,
failure, the typed source of each kind, minify, and ``Records``, the one value that carries
them all from a capture source through the writer to ``Repro.records``.

Data only, like every schema module (``schema_check`` refuses anything else here); the
``schema`` package re-exports every name, so readers import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Union  # noqa: F401 - Any: field types are resolved here

from reproarchive.format.plain import PlainData, Tagged, informative, omit_none, open_record
from reproarchive.format.schema.sets import Stage

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
CompilerInfo = informative("CompilerInfo", "The C++ compiler inductor's CPU backend calls.", __name__, command=str,
                           version=str)
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


@open_record
class AutocastState:
    """Autocast on one device type as the failing call saw it."""

    device_type: str
    enabled: bool = False
    dtype: str | None = omit_none()


@open_record
class ExecutionRecord:
    """(1.2) The thread state the failing call ran under, which changes what a graph computes
    and how it is compiled: grad and inference mode, autocast per device type, deterministic
    algorithms (and ``warn_only``), the default dtype, float32 matmul precision, and which
    inputs were inference tensors. A field that is None was not read; a source that could not
    see the state (a dump, a trace log) writes no record at all."""

    grad_enabled: bool | None = omit_none()
    inference_mode: bool | None = omit_none()
    autocast: tuple[AutocastState, ...] | None = omit_none()
    deterministic: bool | None = omit_none()
    deterministic_warn_only: bool | None = omit_none()
    default_dtype: str | None = omit_none()
    float32_matmul_precision: str | None = omit_none()
    inference_inputs: tuple[int, ...] | None = omit_none()


@open_record
class ShapeDim:
    """(1.3) One dimension of an input (or a symbolic scalar input) as the failing compile saw
    it. ``kind``: ``static``, ``backed`` (a symbol with a hint) or ``unbacked`` (no hint).
    ``size``: its value in the recorded run (absent for an unbacked one nothing ran on);
    ``expr``: the symbolic expression (``s77``, ``2*s0``; absent when static), printed by sympy
    and read back only by ``codec.symbolic_text``; ``source``: where Dynamo read it
    (``L['x'].size()[0]``); ``min``/``max``: the value range of ``expr`` (``max`` absent when
    unbounded); ``origin``: what made it so (``dynamic=True``, ``mark_dynamic``,
    ``mark_unbacked``, ``automatic``, ``static``); ``specialized``: why a dimension asked to be
    dynamic is static (``0/1``); ``equal_to``: the other dimensions with the same expression,
    as ``"<input>.<dim>"``."""

    kind: str
    size: int | None = omit_none()
    expr: str | None = omit_none()
    source: str | None = omit_none()
    min: int | None = omit_none()
    max: int | None = omit_none()
    origin: str | None = omit_none()
    specialized: str | None = omit_none()
    equal_to: tuple[str, ...] = field(default=(), metadata={"omit": "empty"})


@open_record
class ShapeInput:
    """(1.3) The shape policy of one input: ``input`` is its index in ``inputs``; ``kind``
    ``tensor`` (``dims``: one per dimension) or ``symint``/``symfloat``/``symbool`` (``dims``:
    the one value); ``source``: where Dynamo read the input (``L['x']``)."""

    input: int
    kind: str
    source: str | None = omit_none()
    dims: tuple[ShapeDim, ...] = ()


@open_record
class ShapeSymbol:
    """(1.3) One symbol of the compile's ShapeEnv: ``kind`` ``backed`` or ``unbacked``,
    its ``hint`` (value in the recorded run), value range ``min``/``max`` (``max`` absent when
    unbounded), the ``sources`` it was read from, and ``replaced_by``: the expression a guard
    replaced it with (a derived dimension)."""

    name: str
    kind: str
    hint: int | None = omit_none()
    min: int | None = omit_none()
    max: int | None = omit_none()
    sources: tuple[str, ...] = field(default=(), metadata={"omit": "empty"})
    replaced_by: str | None = omit_none()


@open_record
class ShapeEntry:
    """(1.6) The ShapeEnv as Dynamo handed the graph to the backend, before the backend's compile
    added guards of its own (Inductor bounds a size it indexes with: ``s77 <= 4096``):
    ``guards`` rendered as the policy's ``guards`` are, and ``shape_guards``, how many of the
    policy's ``shape_guards`` (the first ones: a ShapeEnv only appends) it held then. A replay
    re-creates this state, never the compile's additions, so that its own compile adds them or
    not; and judges a replay with another backend against it."""

    guards: tuple[str, ...] = ()
    shape_guards: int = 0


@open_record
class ShapePolicy:
    """(1.3) The dynamic-shape policy of the failing compile: how each input dimension was
    made (static, backed or unbacked symbol, from which decision), the ShapeEnv's symbols, its
    ``guards`` (as Dynamo renders them over the inputs' sources: what a replay compares),
    ``shape_guards`` (the ShapeEnv's own guard expressions) and ``runtime_asserts`` (deferred
    runtime asserts), all as text read back only by ``codec.symbolic_text``. ``settings``: the
    ShapeEnv and Dynamo settings that decide symbols (``duck_shape``, ``specialize_zero_one``,
    ``assume_static_by_default`` ...). ``recorded_from``: ``fake_tensors`` (the capture
    backend and crash guard), ``dump`` or ``torch_trace``. The policy is the compile's as it
    ended (its guards included); ``entry`` (1.6, absent when unknown) is the part Dynamo made."""

    recorded_from: str
    inputs: tuple[ShapeInput, ...] = ()
    symbols: tuple[ShapeSymbol, ...] = ()
    guards: tuple[str, ...] = ()
    shape_guards: tuple[str, ...] = ()
    runtime_asserts: tuple[str, ...] = ()
    settings: dict[str, PlainData] = field(default_factory=dict)
    entry: ShapeEntry | None = omit_none()  # (1.6)


@open_record
class GeneratorState:
    """(1.3) One random generator's state just before the failing call: ``device`` is the
    generator's (``cpu``, ``cuda:0``), ``storage`` the storage-table entry whose bytes are the
    state as the device's ``get_rng_state`` returned it (uint8, on the host)."""

    device: str
    storage: int


@open_record
class RngRecord:
    """(1.3) Randomness: ``random_ops`` names the graph's calls that draw random numbers
    (empty: none), ``generators`` the states the failing call started from (empty: the source
    could not see them, e.g. a dump or a trace log)."""

    random_ops: tuple[str, ...] = ()
    generators: tuple[GeneratorState, ...] = ()


# --------------------------------------------------------------------------------------------
# §8 source: where the archive came from, one typed record per kind of source (1.2)


@open_record
class SourceRecord:
    """A source of a kind this version has no record for (a newer writer's, or one written
    before 1.2 without a kind): ``kind`` and ``graph_kind`` (1.1: which of PyTorch's graphs it
    holds) are known, every other key is kept as written."""

    kind: str | None = omit_none()
    graph_kind: str | None = omit_none()


@open_record
class CaptureSource:
    """The capture backend caught the failure in the failing process (``reproarchive.capture``,
    ``capture --``). ``written_before_run``: written before the compiled code ran, kept only
    because the process died; ``program_exit`` then says how ``capture --``'s program ended."""

    TAG_KEY: ClassVar[str] = "kind"
    TAG: ClassVar[str] = "capture"
    kind: ClassVar[str] = "capture"
    stage: str | None = omit_none()
    fwd_only: bool | None = omit_none()
    tolerance: float | None = omit_none()
    check_runtime: bool | None = omit_none()
    written_before_run: bool | None = omit_none()
    program_exit: int | None = omit_none()
    replay: dict[str, PlainData] | None = omit_none()
    # (1.2) an archive written at a door that is not Dynamo's: Inductor's (``capture --after aot``)
    graph_kind: str | None = omit_none()  # None: Dynamo's graph, as a backend receives it
    door: str | None = omit_none()
    real_inputs: int | None = omit_none()


DUMP_KINDS = ("after_dynamo", "after_aot")


@open_record
class DumpSource:
    """A repro script PyTorch's minifier dumped (``pack``); ``kind`` is the graph it holds,
    ``after_dynamo`` or ``after_aot``. What the script was run with (``run_repro``), where its
    data came from (``content_store``, ``inputs``, ``storages``), what module state had to be
    lifted, and how the one replay that recorded the failure went (``replay``)."""

    kind: str = "after_dynamo"
    script: str | None = omit_none()
    run_repro: dict[str, PlainData] | None = omit_none()
    run_repro_non_literal: tuple[str, ...] | None = omit_none()
    save_dir_found: bool | None = omit_none()
    content_store: str | None = omit_none()
    load_args_version: PlainData = omit_none()
    accuracy_mode: str | None = omit_none()
    inputs: tuple[dict[str, PlainData], ...] | None = omit_none()
    storages: dict[str, PlainData] | None = omit_none()
    lifted_module_state: tuple[dict[str, PlainData], ...] | None = omit_none()
    printed_module_state: tuple[str, ...] | None = omit_none()
    environment_origin: str | None = omit_none()
    replay: dict[str, PlainData] | None = omit_none()
    torch_version: str | None = omit_none()
    torch_cuda_version: str | None = omit_none()
    torch_git_version: str | None = omit_none()

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
    compile_id: str | None = omit_none()
    attempt: int | None = omit_none()
    rank: int | None = omit_none()
    frame: PlainData = omit_none()
    user_stack: PlainData = omit_none()
    log: str | None = omit_none()
    trace_format: str | None = omit_none()
    log_lines: dict[str, PlainData] | None = omit_none()
    tlparse: dict[str, PlainData] | None = omit_none()
    graph_from: str | None = omit_none()
    graph_kind: str | None = omit_none()
    backend_origin: str | None = omit_none()
    status: str | None = omit_none()
    diagnostics: PlainData = omit_none()
    metrics: dict[str, PlainData] | None = omit_none()
    cache: PlainData = omit_none()
    graph_breaks: tuple[str, ...] | None = omit_none()
    recompile_reasons: tuple[str, ...] | None = omit_none()
    symbols: PlainData = omit_none()
    accuracy_from: str | None = omit_none()
    real_data_from: str | None = omit_none()
    inputs: PlainData = omit_none()
    config_origin: str | None = omit_none()
    environment_origin: str | None = omit_none()
    replay: dict[str, PlainData] | None = omit_none()
    lifted_module_state: PlainData = omit_none()
    storages: PlainData = omit_none()
    content_store: PlainData = omit_none()


#: ``source`` is one of these by its ``kind``; any other kind (or none) is a ``SourceRecord``.
Source = Annotated[
    Union[CaptureSource, DumpSource, TraceSource, SourceRecord],
    Tagged("kind", {"capture": CaptureSource, **{k: DumpSource for k in DUMP_KINDS}, "torch_trace": TraceSource},
           SourceRecord),
]


# --------------------------------------------------------------------------------------------
# the records of a repro

#: What ``Records.not_original_inputs`` calls an input computed from absent (generated) data.
COMPUTED_FROM_GENERATED = "computed from generated data"


@dataclass(frozen=True)
class Records:
    """Everything an archive says around its graph and inputs, as one value: what failed and
    how to replay it (backend, accuracy, config, environment, failure), where it came from
    (source, parent, minify, created_by), the machine (system), the thread state the failing
    call ran under (execution), the dynamic-shape policy of the failing compile (shapes), its
    randomness (rng) and the user's metadata.

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
    execution: ExecutionRecord | None = omit_none()  # (1.2) absent, not nil, when unknown
    shapes: ShapePolicy | None = omit_none()  # (1.3) absent, not nil, when unknown
    rng: RngRecord | None = omit_none()  # (1.3) absent when the graph draws nothing and no state was read

    def not_original_inputs(self, count: int) -> dict[int, str]:
        """Of the first ``count`` inputs, those whose stored bytes are not the original data, by
        what a minified archive records of them (``minify.inputs``, §8): index -> what they are
        (``COMPUTED_FROM_GENERATED`` for a value computed from absent data). Their storages are
        real (the bytes exist), so fidelity alone does not say it."""
        provenance = self.minify.inputs if self.minify is not None and self.minify.inputs else ()
        return {i: COMPUTED_FROM_GENERATED if p.from_absent else (p.values or "not recorded")
                for i, p in enumerate(provenance[:count]) if not p.real}

    @property
    def graph_kind(self) -> str | None:
        """Which of PyTorch's graphs the archive holds, ``after_dynamo`` or ``after_aot`` (it
        decides how Inductor replays it): a dump says so in its kind, a trace import in
        ``source.graph_kind``; a capture holds Dynamo's graph (None)."""
        if self.source is None:
            return None
        return self.source.graph_kind or (self.source.kind if isinstance(self.source, SourceRecord) else None)

"""``inspect``: what an archive holds, read from its index alone (no blob is decompressed).

A teammate deciding whether an attachment is worth replaying wants the graph's size and ops,
which inputs are real, how big the data is, and what failed where; all of that is in the
index, so inspect costs two small reads however large the archive is. The result is plain
data, typed (``InspectReport``; the CLI prints it as text, or ``to_plain()`` with --json);
the full records are included under ``records``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import field

from reproarchive.archive.extension_rows import CustomOpRow, TritonKernelRow, custom_op_rows, triton_kernel_rows
from reproarchive.archive.graph_code import model_lines
from reproarchive.archive.job_report import JobSummary, job_summary
from reproarchive.format import layout
from reproarchive.format.plain import PlainData, PlainRecord, to_plain
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import (
    DTYPES,
    DerivedValue,
    GraphRecord,
    Index,
    Records,
    SequenceValue,
    ShapeDim,
    ShapePolicy,
    SubclassValue,
    SymValue,
    SystemRecord,
    TensorValue,
)

_OMIT_NONE = {"omit": "none"}  # a key only some rows (or some reports) have


class NamedByIndex(PlainRecord):
    """A report about an archive whose ``digest`` is its index's. An archive has two digests
    (a store names its file by the other), so ``--json`` also says which in a key of its own."""

    COMPUTED = ("index_digest",)

    @property
    def index_digest(self) -> str:
        return self.digest


@dataclasses.dataclass(frozen=True)
class InputRow(PlainRecord):
    """One graph input. Tensors have the tensor fields; symbols ``value`` (the hint) and
    ``expr``; constants ``value`` (left out for ``none``); sequences ``items``."""

    index: int
    name: str | None
    kind: str  # tensor, or the value kind of spec §6.3
    fidelity: str  # real, real (zeros), absent, not original: ..., value, or derived (a size of another input)
    shape: tuple[int, ...] | None = field(default=None, metadata=_OMIT_NONE)
    dtype: str | None = field(default=None, metadata=_OMIT_NONE)
    stride: tuple[int, ...] | None = field(default=None, metadata=_OMIT_NONE)
    offset: int | None = field(default=None, metadata=_OMIT_NONE)
    device: str | None = field(default=None, metadata=_OMIT_NONE)
    bytes: int | None = field(default=None, metadata=_OMIT_NONE)
    requires_grad: bool | None = field(default=None, metadata=_OMIT_NONE)
    dynamic: tuple[int, ...] | None = field(default=None, metadata=_OMIT_NONE)
    storage: int | None = field(default=None, metadata=_OMIT_NONE)
    value: PlainData = field(default=None, metadata=_OMIT_NONE)
    expr: str | None = field(default=None, metadata=_OMIT_NONE)
    items: int | None = field(default=None, metadata=_OMIT_NONE)


@dataclasses.dataclass(frozen=True)
class GraphSummary(PlainRecord):
    nodes: int
    ops: int
    placeholders: int
    op_histogram: dict[str, int]
    submodules: int  # stored attributes (parameters, buffers, nested graphs)
    # (1.7) the model lines the ops came from (their stacks' innermost frames), distinct, in graph
    # order: the first MODEL_LINES of ``model_line_count``
    model_lines: tuple[str, ...] = ()
    model_line_count: int = 0


#: Model lines an inspect report lists (``GraphSummary.model_lines``); the rest are counted.
MODEL_LINES = 12


def graph_summary(graph: GraphRecord) -> GraphSummary:
    lines = model_lines(graph)
    return GraphSummary(nodes=len(graph.nodes), ops=graph.op_count(), placeholders=len(graph.placeholders()),
                        op_histogram=graph.op_histogram(), submodules=len(graph.module_state),
                        model_lines=tuple(lines)[:MODEL_LINES], model_line_count=len(lines))


@dataclasses.dataclass(frozen=True)
class StorageSummary(PlainRecord):
    storages: int
    absent: int
    zero_filled: int
    blobs: int
    bytes_logical: int
    bytes_after_dedup: int
    bytes_compressed: int
    file_bytes: int


@dataclasses.dataclass(frozen=True)
class FailureSummary(PlainRecord):
    stage: str
    exception_type: str
    message: str
    signature: str
    backend: str | None


@dataclasses.dataclass(frozen=True)
class SystemSummary(PlainRecord):
    """The few machine facts that most often explain "fails there, passes here"."""

    torch: str | None
    torch_git: str | None
    python: str | None
    os: str | None
    cpu: str | None
    cuda: str  # its version, or "no (why)"
    gpus: tuple[str, ...] | None
    triton: str | None


@dataclasses.dataclass(frozen=True)
class StoreOrigin(PlainRecord):
    """Where an archive read through a store reference came from."""

    url: str
    name: str | None  # None when the reference named the archive by a digest
    archive: str  # the archive file's digest in the store


@dataclasses.dataclass(frozen=True)
class InspectReport(NamedByIndex):
    """What ``inspect`` says about an archive; ``to_plain()`` is ``inspect --json``."""

    path: str
    format: str
    digest: str  # the index digest
    digest_algorithm: str
    created_by: PlainData
    backend: str | None
    accuracy: bool | None
    parent: str | None
    source: PlainData
    minify: PlainData
    graph: GraphSummary
    inputs: tuple[InputRow, ...]
    not_replayable_here: tuple[str, ...]  # call targets this torch lacks (``run`` answers 125)
    storage: StorageSummary
    failure: FailureSummary | None
    system: SystemSummary | None
    config_changed: PlainData
    config_unrepresentable: PlainData
    environment: PlainData
    records: PlainData  # the full failure, config, environment, system and rng records, for tools
    randomness: str = ""  # whether the graph draws random numbers, and whether the RNG state is recorded
    store: StoreOrigin | None = field(default=None, metadata=_OMIT_NONE)
    job: JobSummary | None = field(default=None, metadata=_OMIT_NONE)  # a multi-rank job's ranks (spec §8 job)
    shapes: PlainData = field(default=None, metadata=_OMIT_NONE)  # (1.3) the shape policy record
    shape_policy: tuple[str, ...] = ()  # the same for people (``shape_policy_lines``)
    custom_ops: tuple[CustomOpRow, ...] = ()  # (spec §8) operators not torch's, and what ``run`` does about each
    triton_kernels: tuple[TritonKernelRow, ...] = ()  # (spec §8) user Triton kernels the graph launches


def shape_policy_lines(policy: ShapePolicy | None) -> list[str]:
    """The policy for people (``inspect``, ``view``): one line per input dimension that is not
    plainly static, then the unbacked symbols, the guards and the runtime asserts."""
    if policy is None:
        return ["not recorded (a replay uses static shapes)"]
    lines = []
    for r in policy.inputs:
        for d, dim in enumerate(r.dims):
            if dim.kind != "static" or dim.specialized:
                where = f"input {r.input} " + (f"dim {d}" if r.kind == "tensor" else r.kind)
                where += f" {dim.source}" if dim.source else ""
                same = ("  same as " + ", ".join("input {} dim {}".format(*ref.split(".")) for ref in dim.equal_to)
                        if dim.equal_to else "")
                lines.append(f"{where}: {_describe_dim(dim)}{same}")
    if not lines:
        lines.append("every input dimension static")
    unbacked = [s for s in policy.symbols if s.kind == "unbacked"]
    if unbacked:
        lines.append("unbacked symbols: " + ", ".join(
            f"{s.name} [{s.min if s.min is not None else '-inf'}, {s.max if s.max is not None else 'inf'}]"
            for s in unbacked))
    lines.extend(f"guard: {g}" for g in policy.guards)
    if policy.entry is not None and sorted(policy.entry.guards) != sorted(policy.guards):
        lines.extend(f"guard at backend entry (Dynamo's, before the compile): {g}"
                     for g in policy.entry.guards)
    lines.extend(f"runtime assert: {a}" for a in policy.runtime_asserts)
    return lines


def _describe_dim(dim: ShapeDim) -> str:
    """One dimension for people: ``8``, ``s77=8 [2, 64] mark_dynamic``, ``u0 (unbacked)``."""
    if dim.kind == "static":
        return f"{dim.size}" + (" (0/1 specialised)" if dim.specialized else "")
    text = f"{dim.expr}" + (f"={dim.size}" if dim.size is not None else "")
    if dim.min is not None or dim.max is not None:
        text += f" [{dim.min if dim.min is not None else '-inf'}, {dim.max if dim.max is not None else 'inf'}]"
    if dim.kind == "unbacked":
        text += " unbacked"
    return text + (f" {dim.origin}" if dim.origin else "")


def randomness_label(records: Records) -> str:
    """What the archive says about randomness (spec §8 ``rng``), for people: the graph's random
    ops and the generators whose state it holds, or that it does not say."""
    rng = records.rng
    if rng is None:
        return "RNG unknown: the archive does not record random ops or generator states"
    ops = f"random ops: {', '.join(rng.random_ops)}" if rng.random_ops else "no random ops"
    if rng.generators:
        return f"{ops}; RNG state recorded ({', '.join(g.device for g in rng.generators)})"
    return f"{ops}; RNG state not recorded"


def input_rows(index: Index) -> list[InputRow]:
    """One row per graph input: what ``inspect`` lists and ``view`` tabulates."""
    rows = []
    derived = index.not_original_inputs()
    placeholders = index.graph.placeholders()  # one per input, in order (spec: checked at decode)
    for i, rec in enumerate(index.inputs):
        # a tensor records its placeholder's name; a SymInt, a scalar or a list has only the placeholder
        name = getattr(rec, "name", None) or (placeholders[i].name if i < len(placeholders) else None)
        if isinstance(rec, TensorValue):
            st = index.storages[rec.storage]
            fidelity = ((st.fidelity if st.fill is None else "real (zeros)") if i not in derived
                        else f"not original: {derived[i]}")
            rows.append(InputRow(
                i, name, "tensor", fidelity, shape=tuple(rec.shape), dtype=rec.dtype, stride=tuple(rec.stride),
                offset=rec.offset, device=st.device, bytes=math.prod(rec.shape) * DTYPES[rec.dtype][0],
                requires_grad=rec.requires_grad, dynamic=tuple(d for d, _ in rec.dynamic), storage=rec.storage,
            ))
        elif isinstance(rec, SymValue):
            rows.append(InputRow(i, name, rec.kind, "value", value=rec.hint, expr=rec.expr))
        elif isinstance(rec, SequenceValue):
            rows.append(InputRow(i, name, rec.kind, "value", items=len(rec.items)))
        elif isinstance(rec, SubclassValue):  # its inner tensors are rows of their own in `inspect --json`'s storages
            inner = [index.storages[t.storage] for t in rec.tensors()]
            fidelity = "real" if all(s.is_real for s in inner) else "absent" if inner else "value"
            rows.append(InputRow(i, name, "subclass", fidelity, value=f"{rec.cls.rsplit('.', 1)[-1]}"
                                 f"[{', '.join(rec.size)}] ({', '.join(rec.attrs)})", items=len(rec.items),
                                 requires_grad=rec.requires_grad))
        elif isinstance(rec, DerivedValue):  # computed from input rec.input when loaded (a ragged size, j1)
            rows.append(InputRow(i, name, rec.kind, "derived", value=f"of input {rec.input}, dim {rec.dim}",
                                 expr=rec.expr))
        else:
            rows.append(InputRow(i, name, rec.kind, "value", value=rec.value))
    return rows


def _storage_stats(reader: ContainerReader, index: Index) -> StorageSummary:
    storages = index.storages
    unique = {s.digest: s.size for s in storages if s.digest}
    compressed = sum(m.compressed for name, m in reader.members.items() if layout.is_blob_name(name))
    return StorageSummary(
        storages=len(storages),
        absent=sum(1 for s in storages if s.fidelity == "absent"),
        zero_filled=sum(1 for s in storages if s.fill == 0),
        blobs=len(unique),
        bytes_logical=sum(s.size for s in storages if s.is_real),
        bytes_after_dedup=sum(unique.values()),
        bytes_compressed=compressed,
        file_bytes=reader.file_size,
    )


def system_summary(system: SystemRecord) -> SystemSummary:
    """The few machine facts that most often explain "fails there, passes here"."""
    cuda = system.cuda
    if cuda is not None and cuda.available:
        cuda_text = cuda.version or "available"
    else:
        cuda_text = f"no ({(cuda.reason if cuda else None) or 'not available'})"
    return SystemSummary(
        torch=system.torch.version if system.torch else None,
        torch_git=system.torch.git_version if system.torch else None,
        python=system.python.version if system.python else None,
        os=system.os.platform if system.os else None,
        cpu=system.cpu.model if system.cpu else None,
        cuda=cuda_text,
        gpus=tuple(g.name for g in (cuda.devices or ())) or None if cuda else None,
        triton=(system.packages or {}).get("triton"),
    )


def inspect(path: str | os.PathLike, *, limits: layout.Limits = layout.DEFAULT_LIMITS) -> InspectReport:
    """A typed summary of an archive (the CLI prints it as text, or ``to_plain()`` with --json).

    It refuses what load would refuse from the index alone (including call targets outside
    the allowlist), so "inspect shows it" never means "load would run something unsafe"."""
    from reproarchive.codec.checks import check_readable_here  # imports torch: only here, not for view

    with ContainerReader(path, limits=limits) as reader:
        index = reader.index
        missing = check_readable_here(index, replaying=False)
        graph = index.graph
        records = index.records
        failure, config, environment = records.failure, records.config, records.environment
        return InspectReport(
            path=str(path),
            format=index.version,
            digest=reader.index_digest,
            digest_algorithm=index.digest_algorithm,
            created_by=to_plain(records.created_by) if records.created_by else None,
            backend=records.backend,
            accuracy=records.accuracy,
            parent=records.parent,
            source=to_plain(records.source) if records.source else None,
            minify=to_plain(records.minify) if records.minify else None,
            graph=graph_summary(graph),
            inputs=tuple(input_rows(index)),
            not_replayable_here=tuple(missing),
            storage=_storage_stats(reader, index),
            failure=(FailureSummary(failure.stage, failure.exception_type, failure.message, failure.signature,
                                    failure.backend) if failure else None),
            system=system_summary(records.system) if records.system else None,
            config_changed=(config.changed or None) if config else None,
            config_unrepresentable=[to_plain(u) for u in config.unrepresentable] or None if config else None,
            environment=(environment.variables or None) if environment else None,
            # the full records, for --json readers and tools; the summaries above are for people
            records={key: (to_plain(getattr(records, key)) if getattr(records, key) is not None else None)
                     for key in ("failure", "config", "environment", "system", "rng")},
            shapes=to_plain(records.shapes) if records.shapes is not None else None,
            shape_policy=tuple(shape_policy_lines(records.shapes)),
            custom_ops=custom_op_rows(index),
            triton_kernels=triton_kernel_rows(index),
            job=job_summary(index.job, index.records) if index.job is not None else None,
            randomness=randomness_label(records),
        )

"""``pack``: a GraphModule and its inputs -> records -> one archive file.

Packing hashes storages ahead of the one being written while its frames are encoded
(hashlib, xxhash and zstd all release the GIL), one thread per core this process may use,
so the stages overlap instead of adding up.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx as fx

from reproarchive.codec import custom_ops as custom_op_codec
from reproarchive.codec import graphs as graph_codec
from reproarchive.codec import tensors as tensor_codec
from reproarchive.codec import triton_kernels as triton_kernel_codec
from reproarchive.codec.custom_ops import LiveCustomOp
from reproarchive.codec.rng import encode_rng
from reproarchive.codec.tensors import StorageTable, storage_view
from reproarchive.context.execution import inference_inputs
from reproarchive.context.redaction import text_redactor, working_folder
from reproarchive.errors import (
    PackError,
    SchemaViolation,
)
from reproarchive.format import digests, frames, layout, plain
from reproarchive.format.atomic import atomic_file
from reproarchive.format.parallel import WorkQueue, worker_threads
from reproarchive.format.schema import (
    ContainerRecord,
    CreatedBy,
    CustomOpCall,
    CustomOpRecord,
    GraphRecord,
    Index,
    JobRecord,
    Records,
    TritonKernelRecord,
    Value,
)
from reproarchive.format.writer import ContainerWriter
from reproarchive.package_version import __version__
from reproarchive.progress import ProgressFn, Tracker

GRAPH_CODE_MEMBER = layout.GRAPH_CODE_MEMBER
_ZERO_PROBE = 4096


def as_records(records: Records | Mapping[str, Any] | None) -> Records:
    """The records for ``pack``: a ``Records`` as is, or a mapping of section name -> record or
    plain data (``{"failure": {...}, "backend": "eager"}``), checked against the schema."""
    if records is None:
        return Records()
    if isinstance(records, Records):
        return records
    if not isinstance(records, Mapping):
        raise PackError(f"records must be a Records or a mapping, not {type(records).__name__}")
    unknown = sorted(set(records) - {f.name for f in dataclasses.fields(Records)})
    if unknown:
        raise PackError(f"{unknown[0]!r} is not a record section",
                        f"the sections are {', '.join(f.name for f in dataclasses.fields(Records))}")
    try:
        return plain.from_plain(Records, {k: plain.to_plain(v) if dataclasses.is_dataclass(v) else v
                                          for k, v in records.items() if v is not None})
    except SchemaViolation as exc:
        raise PackError(f"the records cannot be stored: {exc}", "records hold plain data (str keys; "
                        "None, bool, int64, float, str, bytes, lists and maps of these)") from None


def _host_bytes(storage: torch.UntypedStorage):
    """Bytes of a storage on the host: zero-copy for CPU, one copy for device storages."""
    if storage.device.type != "cpu":
        storage = storage.cpu()
    return storage, storage_view(storage)


def is_zero_bytes(view: memoryview) -> bool:
    if len(view) == 0:
        return False
    head, tail = bytes(view[:_ZERO_PROBE]), bytes(view[-_ZERO_PROBE:])
    if head.count(0) != len(head) or tail.count(0) != len(tail):
        return False
    return not bool(torch.frombuffer(view, dtype=torch.uint8).any())


def _digest_job(storage: torch.UntypedStorage, algorithm: str):
    keep, view = _host_bytes(storage)
    if is_zero_bytes(view):
        return keep, view, None
    h = digests.new_hasher(algorithm)
    h.update(view)
    return keep, view, f"{algorithm}:{h.hexdigest()}"


def _custom_op_records(gm: fx.GraphModule, live: Sequence[LiveCustomOp] | None,
                       table: StorageTable) -> tuple[CustomOpRecord, ...] | None:
    """The ``custom_ops`` record (spec §8): the custom ops ``gm`` calls, with the recorded calls
    of ``live`` where given (a capture, a loaded archive), else described from this process."""
    used = {custom_op_codec.op_name(op) for op in custom_op_codec.custom_ops_of(gm)}
    if not used:
        return None
    given = {op.name: op for op in live or ()}
    here: dict[str, LiveCustomOp] = {}
    out = []
    for name in sorted(used):
        op = given.get(name)
        if op is None:  # no live record given for it: described from this process, no calls
            here = here or {o.name: o for o in custom_op_codec.described(gm)}
            op = here[name]
        calls = tuple(CustomOpCall(arguments=c.arguments,
                                   outputs=tuple(tensor_codec.encode_value(v, table) for v in c.outputs))
                      for c in op.calls)
        out.append(dataclasses.replace(op.record, calls=calls))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class ArchiveContents:
    """What an archive of a graph holds but its blobs. ``pack`` writes it into one file; a spool
    (``archive.spool``) keeps it beside blobs it writes once per process. The storage table's
    digests are resolved by the writer (``table.resolve``) before it asks for the ``index``."""

    table: StorageTable                     # storages, digests still to resolve
    inputs: tuple[Value, ...]               # one input record per placeholder
    graph: GraphRecord
    code: bytes                             # the graph's readable code, as stored
    records: Records                        # as given, ``created_by`` and ``rng`` this writer's
    custom_ops: tuple[CustomOpRecord, ...]  # the custom ops the graph calls
    triton_kernels: tuple[TritonKernelRecord, ...] | None = None  # (1.4) the Triton kernels it launches

    def index(self, *, frame_size: int, digest_algorithm: str, job: JobRecord | None) -> Index:
        """The archive's index, once every storage's digest is resolved."""
        return Index(container=ContainerRecord(frame_size=frame_size), digest_algorithm=digest_algorithm,
                     storages=tuple(self.table.records), inputs=self.inputs, graph=self.graph,
                     records=self.records, job=job, custom_ops=self.custom_ops, triton_kernels=self.triton_kernels)


def archive_contents(gm: fx.GraphModule, example_inputs: Sequence[Any],
                     records: Records | Mapping[str, Any] | None, *, custom_ops: Sequence[LiveCustomOp] | None = None,
                     rng_states: Mapping[str, torch.Tensor] | None = None,
                     device_names: Mapping[str, str] | None = None,
                     prefixes: Mapping[str, str] | None = None) -> ArchiveContents:
    """Everything an archive of ``gm`` holds but its blobs (``ArchiveContents``).
    ``custom_ops``/``rng_states``/``device_names``/``prefixes``: as ``pack`` takes them."""
    if not isinstance(gm, fx.GraphModule):
        raise PackError(f"pack needs a torch.fx.GraphModule, got {type(gm).__name__}")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = list(example_inputs)
    if len(inputs) != len(placeholders):
        raise PackError(
            f"graph has {len(placeholders)} placeholders but {len(inputs)} example inputs were given",
            "pass exactly one example input per placeholder, in order",
        )
    records = dataclasses.replace(
        as_records(records), created_by=CreatedBy(reproarchive=__version__, torch=torch.__version__.split("+")[0]))
    if records.parent is not None:
        digests.parse(records.parent)
    if records.execution is not None:  # the inputs stored here (a minified archive's are others)
        records = dataclasses.replace(records, execution=dataclasses.replace(
            records.execution, inference_inputs=inference_inputs(inputs)))
    table = StorageTable(device_names)
    input_records = tensor_codec.encode_inputs(inputs, table, [n.name for n in placeholders],
                                               [graph_codec.dynamic_dims(n) for n in placeholders])
    paths = _stack_paths(prefixes)
    graph_record = graph_codec.encode_graph(gm, table, paths=paths)
    op_records = _custom_op_records(gm, custom_ops, table)
    graph_record, kernel_records = triton_kernel_codec.archive_records(  # (1.4) launches renumbered
        graph_record, custom_ops or (), lambda t: tensor_codec.encode_value(t, table))
    records = dataclasses.replace(records, rng=encode_rng(gm, rng_states, table))  # after the graph's tensors
    code = graph_codec.readable_code(gm, paths).encode()
    return ArchiveContents(table=table, inputs=input_records, graph=graph_record, code=code, records=records,
                    custom_ops=op_records, triton_kernels=kernel_records)


def _stack_paths(prefixes: Mapping[str, str] | None) -> Callable[[str], str]:
    """The redaction of a graph's stack frames (spec §8: no path of this machine in what an
    archive holds): ``prefixes``, the writer's own folders, else the working folder written
    ``.``; its prefix table is looked up at the first frame, so a graph without stacks costs
    nothing."""
    redact: Callable[[str], str] | None = None

    def paths(text: str) -> str:
        nonlocal redact
        if redact is None:
            redact = text_redactor(working_folder() if prefixes is None else prefixes)
        return redact(text)

    return paths


def _look_ahead(table: StorageTable, real: list[int], threads: int) -> int:
    """How many storages are hashed ahead of the one being compressed (the digest names the
    blob, so it must be known before its first frame is written). CPU storages are hashed in
    place, so looking further ahead costs no memory; a device storage costs a host copy while
    queued."""
    return 2 * threads if all(table.sources[i].device.type == "cpu" for i in real) else 1


def _write_storages(writer: ContainerWriter, pool: WorkQueue, table: StorageTable, real: list[int], digest: str,
                    ahead: int, pbar: Tracker, pending: dict[int, concurrent.futures.Future]) -> None:
    """Every stored storage as a blob member, once per digest (equal storages share one blob);
    ``pending`` is the caller's, so it can cancel the hashes still queued when packing fails."""
    written: set[str] = set()

    def submit(k: int) -> None:
        if k < len(real) and k not in pending:
            pending[k] = pool.submit(_digest_job, table.sources[real[k]], digest)

    for k in range(ahead):
        submit(k)
    for k, sidx in enumerate(real):
        submit(k + ahead)
        keep, view, dg = pending.pop(k).result()
        table.resolve(sidx, dg)
        if dg is not None and dg not in written:
            writer.add_member(digests.blob_member_name(dg), view, keep=keep)
            written.add(dg)
        else:
            pbar.update(table.records[sidx].size)
        del keep, view


def pack(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    path: str | os.PathLike,
    *,
    records: Records | Mapping[str, Any] | None = None,
    job: JobRecord | None = None,
    digest: str = digests.DEFAULT_ALGORITHM,
    level: int = layout.DEFAULT_LEVEL,
    frame_size: int = layout.DEFAULT_FRAME_SIZE,
    min_saving: float = frames.MIN_SAVING,
    progress: ProgressFn | None = None,
    custom_ops: Sequence[LiveCustomOp] | None = None,
    rng_states: Mapping[str, torch.Tensor] | None = None,
    device_names: Mapping[str, str] | None = None,
    prefixes: Mapping[str, str] | None = None,
) -> Path:
    """Write ``gm``, one example input per placeholder and ``records`` to ``path`` (atomically).

    ``job`` (spec §8, 1.3): one rank's job record (its part, which ``archive.job_merge`` joins
    with the others'); its ranks' own inputs must already point into storages of this archive.
    The records are stored as given (``created_by`` is this writer's); capture sources write
    through ``archive.writing.write_capture``, which redacts them first. Frames that zstd
    ``level`` shrinks by less than ``min_saving`` are stored uncompressed (0: compress all).
    ``rng_states``: the generator states (device -> uint8 tensor, ``codec.rng.rng_snapshot``)
    the failing call started from, stored as storages (``records.rng`` is replaced).
    ``device_names``: a storage's recorded device by its tensor's device here, where they differ
    (a compile-only minify holds an absent GPU's tensors on meta: ``{"meta": "cuda:0"}``).
    ``prefixes``: the writer's folders (``{folder: label}``; default ``{cwd: "."}``) for stacks."""
    digests.check_algorithm(digest)
    ready = archive_contents(gm, example_inputs, records, custom_ops=custom_ops, rng_states=rng_states,
                             device_names=device_names, prefixes=prefixes)
    table, code = ready.table, ready.code

    real = [i for i, r in enumerate(table.records) if r.is_real]
    # the bar counts member bytes as their frames reach the file, and skipped storages at once
    total = sum(table.records[i].size for i in real) + len(code) + len(layout.layout_member_bytes())
    threads = worker_threads()
    ahead = _look_ahead(table, real, threads)
    pbar = Tracker(progress, "pack", total)
    # One thread per core this process may use, this one included: it hashes and encodes too
    # whenever it would otherwise wait (WorkQueue), so a busy core never holds up the others.
    with atomic_file(path) as f, WorkQueue(threads - 1, name="reproarchive-pack") as pool:
        writer = ContainerWriter(f, level=level, frame_size=frame_size, executor=pool,
                                 progress=pbar.update, direct_io=True, min_saving=min_saving)
        pending: dict[int, concurrent.futures.Future] = {}  # before the try: its cleanup reads it
        try:
            writer.add_member(GRAPH_CODE_MEMBER, code)
            _write_storages(writer, pool, table, real, digest, ahead, pbar, pending)
            index = ready.index(frame_size=frame_size, digest_algorithm=digest, job=job)
            try:
                writer.finish(index)
            except SchemaViolation as exc:
                raise PackError(f"the archive's records cannot be stored: {exc}") from None
        except BaseException:
            writer.abandon()
            for fut in pending.values():
                fut.cancel()
            raise
    return Path(path)

"""``load`` and ``read_input``: archive bytes -> records -> a GraphModule and its inputs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.fx as fx

from reproarchive.archive.memory import check_declared_memory
from reproarchive.codec import graphs as graph_codec
from reproarchive.codec import tensors as tensor_codec
from reproarchive.codec.checks import check_readable_here, recorded_devices
from reproarchive.codec.custom_ops import LiveCall, LiveCustomOp
from reproarchive.codec.devices import remap_graph_devices, resolve_devices
from reproarchive.codec.input_demands import storage_demands
from reproarchive.codec.rng import decode_rng
from reproarchive.codec.stand_ins import BROUGHT_MODULES
from reproarchive.codec.stand_ins import install as install_stand_ins
from reproarchive.codec.stand_ins import set_calls as stand_in_calls
from reproarchive.codec.tensors import FIDELITY_ABSENT, FIDELITY_REAL, storage_view
from reproarchive.codec.triton_kernels import LaunchBinder, LiveTritonCall, LiveTritonKernel, brought_kernels
from reproarchive.context.execution import rebuilt_as_inference
from reproarchive.errors import (
    IndexSchemaError,
    LimitExceededError,
)
from reproarchive.format import digests, layout
from reproarchive.format.layout import Limits
from reproarchive.format.parallel import worker_threads
from reproarchive.format.prefault import prefault
from reproarchive.format.reader import ContainerReader
from reproarchive.format.schema import DerivedValue, Index, Records, StorageRecord
from reproarchive.progress import ProgressFn, Tracker

# --------------------------------------------------------------------------------------------
# load


@dataclasses.dataclass
class Repro:
    """A loaded archive: the rebuilt graph, its inputs on the target device, and the records.

    ``fidelity`` says per input whether its data is ``real``, ``absent`` (generated here) or a
    plain ``value``; ``warnings`` are the notes load also issued as Python warnings;
    ``rng_states`` the recorded generator states by the device they apply to here (spec §8
    ``rng``; empty: not recorded).
    """

    gm: fx.GraphModule
    args: list
    path: Path
    digest: str
    index: Index
    fidelity: list[str]
    devices: dict[str, str]
    warnings: list[str]
    # recorded calls, decoded: of custom ops, and (1.4) launches of Triton kernels (LiveTritonKernel)
    custom_ops: list[LiveCustomOp] = dataclasses.field(default_factory=list)
    # custom ops replayed from them, and Triton kernels (``triton:<name>``)
    stand_ins: list[str] = dataclasses.field(default_factory=list)
    rng_states: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    # set by a replay that only compiles (``replay.compile_only.CompileOnly``): every judgement of
    # this archive, a minifier's candidates included, compiles and launches nothing
    compile_only: Any = None

    @property
    def records(self) -> Records:
        """The records around the graph in one piece (backend, accuracy, config, environment,
        system, failure, source, minify ...: spec §8), as the index holds them."""
        return self.index.records

    @property
    def input_records(self) -> tuple:
        """The index's records of the graph's inputs (``args`` were built from them)."""
        return self.index.inputs


def _torch_errors_as_archive_errors(fn):
    """After validation, load only allocates and builds tensors and a graph from the records, so
    a torch error there means the records ask for something this process cannot build: report
    it as the archive's defect (one line), not as a traceback from inside torch."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MemoryError:
            raise LimitExceededError(
                "this machine cannot allocate the memory the archive's storages declare",
                "replay on a machine with more memory, or check the archive with `reproarchive inspect`",
            ) from None
        except RuntimeError as exc:
            first = (str(exc).splitlines() or [""])[0][:200]
            if "alloc" in first.lower() or "out of memory" in first.lower():
                raise LimitExceededError(
                    f"cannot allocate the archive's storages here ({first})",
                    "replay on a machine with more memory, or check the archive with `reproarchive inspect`",
                ) from exc
            raise IndexSchemaError(f"the archive's records cannot be built into tensors and a graph: {first}") from exc

    return wrapper


@_torch_errors_as_archive_errors
def load(path: str | os.PathLike, *, device=None, progress: ProgressFn | None = None,
         limits: Limits = layout.DEFAULT_LIMITS,
         remap_graph: bool = True, max_memory: int | None = None, reader: ContainerReader | None = None,
         stand_ins: bool = True) -> Repro:
    """Rebuild the graph and its inputs from an archive, on ``device``.

    ``device=None`` keeps each storage's recorded device where this machine has it and falls
    back to CPU with a warning; a string moves everything there; a mapping such as
    ``{"cuda:0": "cpu"}`` or ``{"cuda": "cuda:1"}`` remaps by exact device or device type (a
    key the archive does not use is an error). A ``DevicePlan`` (``resolve_devices``, what a
    replay passes) is used as resolved, without checking this machine again.
    Inputs recorded as absent get seeded generated data and a loud warning. Device constants
    inside the graph follow the same mapping unless ``remap_graph=False`` (``export`` writes
    them as recorded, for its script to map). Before anything is allocated, the storages'
    declared sizes (real and absent) are compared with the memory available here and with
    ``max_memory`` (bytes); a load that would not fit raises ``LimitExceededError``.
    ``reader``: ``path`` already open, so that its index is not decoded again (the caller closes it).
    A custom op the graph calls that this process does not have gets a stand-in that returns
    its recorded outputs (``codec.stand_ins``; ``Repro.stand_ins`` names them, a warning says
    so); ``stand_ins=False`` leaves it missing (the graph then cannot be built here).

    Of a multi-rank job archive this is the primary rank (``archive.job.load_job`` rebuilds
    any rank, through the same ``rebuild``).
    """
    opened = ContainerReader(path, limits=limits) if reader is None else contextlib.nullcontext(reader)
    with opened as reader:  # noqa: PLR1704 - the reader given, or the one opened here
        index = reader.index
        # before the graph's targets are checked: a stand-in is what a missing custom op resolves to
        stood_in = install_stand_ins(index.custom_ops or ()) if stand_ins else []
        check_readable_here(index)
        built = rebuild(reader, index.graph, index.inputs, index.records, device=device, progress=progress,
                        remap_graph=remap_graph, max_memory=max_memory, stood_in=stood_in, path=path)
        return Repro(built.gm, built.args, Path(path), reader.index_digest, index, built.fidelity, built.devices,
                     built.notes, built.custom_ops, built.stand_ins, built.rng_states)


@dataclasses.dataclass
class Rebuilt:
    """One graph of an archive (its own, or a rank's of a job) rebuilt here: what ``Repro``
    holds of it, and the notes load also issued as warnings."""

    gm: fx.GraphModule
    args: list
    fidelity: list[str]
    devices: dict[str, str]
    notes: list[str]
    custom_ops: list
    stand_ins: list[str]
    rng_states: dict


def rebuild(reader: ContainerReader, graph: Any, inputs: Sequence[Any], records: Records, *, device=None,
            progress: ProgressFn | None = None, remap_graph: bool = True, max_memory: int | None = None,
            stood_in: Sequence[str] = (), path: str | os.PathLike, warn: bool = True) -> Rebuilt:
    """``graph`` and ``inputs`` of the open archive (the index's own, or one rank's of a job)
    with ``records`` (theirs: the execution state, the generator states), as ``load`` documents
    it. Only the storages they use are read: a rank of a job reads its own, never every rank's.
    ``stood_in``: the custom ops the caller installed stand-ins for (``codec.stand_ins.install``,
    once per archive, before its targets were checked); their recorded calls are given here.
    ``warn=False``: the notes are returned, not also issued as warnings."""
    index, limits = reader.index, reader.limits
    mapper = resolve_devices(recorded_devices(index), device, missing="cpu")
    notes = [f"recorded device {name} is not available here; loading on cpu" for name in mapper.fallback]
    table = index.storages
    used, states, tensor_records = _used_storages(index, graph, inputs, records)
    targets, devices = _storage_targets(table, used, states, mapper)
    check_declared_memory(((table[i].size, targets[i]) for i in used), max_memory=max_memory)
    total = sum(table[i].size for i in used if table[i].digest)
    storages = _materialize(reader, table, used, targets, tensor_codec.storage_dtypes(tensor_records),
                            Tracker(progress, "load", total).update, path=path, limits=limits,
                            demands=storage_demands(inputs, table, graph))
    decoder = tensor_codec.ValueDecoder(storages, targets)
    custom_ops, kernels, launches = _live_calls(index, decoder, stood_in)
    # Device constants inside the graph follow the inputs (a CUDA graph loaded on CPU
    # must not still create tensors on cuda).
    gm = graph_codec.GraphDecoder(decoder.tensor, launches).decode(graph)
    if remap_graph:
        remap_graph_devices(gm, mapper)
    args = tensor_codec.decode_inputs(decoder, inputs)
    execution = records.execution
    for i in (execution.inference_inputs or ()) if execution is not None else ():
        if isinstance(args[i], torch.Tensor):  # an inference tensor, as recorded (spec §8 execution)
            args[i] = rebuilt_as_inference(args[i])
    fidelity = [input_fidelity(r, table, targets) for r in inputs]
    notes += _input_notes(index, records, inputs, fidelity)
    notes += _stand_in_notes(index, stood_in, launches)
    if warn:
        for note in notes:
            warnings.warn(note, stacklevel=4)
    rng_states = decode_rng(records.rng, storages, {d: str(mapper(d)) for d in recorded_devices(index)})
    return Rebuilt(gm, args, fidelity, devices, notes, [*custom_ops, *kernels],
                   [*stood_in, *(f"triton:{n}" for n in launches.stand_ins)], rng_states)


def _used_storages(index: Index, graph: Any, inputs: Sequence[Any], records: Records) -> tuple[list[int], set, tuple]:
    """The storages this graph and these inputs need (with the custom ops' and kernels' recorded
    results and the generator states), so a rank of a job never reads another rank's."""
    states = {g.storage for g in records.rng.generators} if records.rng is not None else set()
    ops_tensors = [t for op in index.custom_ops or () for t in op.tensors()]
    kernel_tensors = [t for k in index.triton_kernels or () for c in k.calls for v in c.written.values()
                      for t in v.tensors()]
    used = sorted({t.storage for v in inputs for t in v.tensors()} | {t.storage for t in graph.tensors()}
                  | {t.storage for t in (*ops_tensors, *kernel_tensors)} | states)
    tensor_records = (*(t for v in inputs for t in v.tensors()), *graph.tensors(), *ops_tensors, *kernel_tensors)
    return used, states, tensor_records


def _storage_targets(table: Sequence[StorageRecord], used: list[int], states: set,
                     mapper: Any) -> tuple[list[Any], dict[str, str]]:
    """Where each used storage goes here, and the recorded -> local device map that says so."""
    targets: list[Any] = [None] * len(table)
    devices: dict[str, str] = {}
    for i in used:
        if i in states:  # a generator state: host bytes, whatever the generator's device
            targets[i] = torch.device("cpu")
            continue
        devices[table[i].device] = mapper(table[i].device)
        targets[i] = torch.device(devices[table[i].device])
    return targets, devices


def _live_calls(index: Index, decoder: tensor_codec.ValueDecoder,
                stood_in: Sequence[str]) -> tuple[list, list, LaunchBinder]:
    """The recorded custom-op and Triton calls with their results decoded, which the stand-ins
    return; the graph decoder needs the launches before it can decode a kernel's node."""
    custom_ops = [LiveCustomOp(dataclasses.replace(op, calls=()),
                               [LiveCall(c.arguments, tuple(map(decoder.decode, c.outputs))) for c in op.calls])
                  for op in index.custom_ops or ()]
    stand_in_calls([op for op in custom_ops if op.name in stood_in])
    kernels = [LiveTritonKernel(dataclasses.replace(k, constants=(), calls=()), [
        LiveTritonCall(dict(k.constants[c.constants]), dict(c.arguments),
                       {n: decoder.decode(v) for n, v in c.written.items()}) for c in k.calls])
        for k in index.triton_kernels or ()]
    launches = LaunchBinder(index.triton_kernels or (), brought_kernels(BROUGHT_MODULES),
                            {k.record.digest: k.calls for k in kernels})
    return custom_ops, kernels, launches


def _input_notes(index: Index, records: Records, inputs: Sequence[Any], fidelity: list) -> list[str]:
    """Inputs that are not the original run's data: generated, or made by the minifier."""
    notes = []
    absent = [i for i, f in enumerate(fidelity) if f == FIDELITY_ABSENT]
    if absent:
        names = ", ".join(str(getattr(inputs[i], "name", None) or i) for i in absent[:8])
        notes.append(f"{len(absent)} input(s) had no data in the archive ({names}); "
                     "they were filled with generated values, so the replay is not the original run")
    derived = index.not_original_inputs(records, tuple(inputs))
    if derived:
        names = ", ".join(f"{getattr(inputs[i], 'name', None) or i} ({what})" for i, what in list(derived.items())[:8])
        notes.append(f"{len(derived)} input(s) of this minified archive are not the original data: {names}; "
                     "the replay is not the original run")
    return notes


def _stand_in_notes(index: Index, stood_in: Sequence[str], launches: LaunchBinder) -> list[str]:
    """Custom ops and Triton kernels a stand-in replaces: they answer only the recorded calls."""
    notes = []
    for name in stood_in:
        op = next(o for o in index.custom_ops if o.name == name)
        generated = any(index.storages[t.storage].fidelity == FIDELITY_ABSENT for t in op.tensors())
        notes.append(f"custom op {name} is not registered here: a stand-in returns "
                     + ("GENERATED outputs of the recorded shapes (the source had no data)" if generated else
                        f"its {len(op.calls)} recorded output(s) and fails on any other input")
                     + " (bring the real op with --import / --load-library)")
    for name in launches.stand_ins:
        kernel = next(k for k in index.triton_kernels if k.name == name)
        notes.append(f"Triton kernel {name} is not here: a stand-in writes its {len(kernel.calls)} recorded "
                     "result(s) and fails on any other input (bring the kernel with --import MODULE)")
    return notes


def _materialize(reader: ContainerReader, records: Sequence[StorageRecord], which, devices: list[torch.device],
                 dtypes: dict[int, torch.dtype], progress, *, path, limits: Limits, demands=None) -> list:
    """Storages ``which`` of the storage table, on their devices (others stay None).

    Each distinct blob is decompressed once; a storage that merely has the same bytes as an
    earlier one gets its own copy (it was a storage of its own when packed).
    """
    which = list(which)
    first_use: dict[str, int] = {}
    for i in which:
        if records[i].digest is not None:
            first_use.setdefault(records[i].digest, i)
    blobs = _read_blobs(reader, [(dg, records[i].size, devices[i]) for dg, i in first_use.items()], progress,
                        path=path, limits=limits)

    def real(i: int) -> torch.UntypedStorage:
        st = blobs[records[i].digest]
        if first_use[records[i].digest] != i:
            st = st.clone() if st.device == devices[i] else st.to(device=devices[i])
            if progress is not None:
                progress(records[i].size)
        return st

    return tensor_codec.build_storages(records, which, devices, dtypes, real, demands)


# Below this many bytes a second reader (it re-reads and re-checks the index) costs more than
# it saves; above it, blobs are decompressed on several threads at once.
_PARALLEL_LOAD_BYTES = 96 << 20


def _read_blobs(reader: ContainerReader, jobs: list[tuple[str, int, torch.device]], progress, *,
                path, limits: Limits) -> dict[str, torch.UntypedStorage]:
    """Each blob decompressed straight into a fresh storage of its size (no staging copy).

    ``jobs`` are (digest, size, device). Large loads use one reader per thread (a zstd
    decompression context is single-threaded), largest blobs first so the threads finish
    together; zstd releases the GIL, so decompression and the first touch of the new
    memory both proceed in parallel.
    """
    out: dict[str, torch.UntypedStorage] = {}
    lock = threading.Lock()

    def read(r: ContainerReader, job) -> None:
        dg, size, dev = job
        if dev.type == "meta":  # shapes without data (a compile-only replay): nothing to read
            out[dg] = torch.UntypedStorage(size, device="meta")
            return
        host = torch.empty(size, dtype=torch.uint8).untyped_storage()
        prefault(host.data_ptr(), size)
        r.read_member_into(digests.blob_member_name(dg), storage_view(host))
        out[dg] = host if dev.type == "cpu" else host.to(device=dev)
        if progress is not None:
            with lock:
                progress(size)

    threads = min(worker_threads(), len(jobs))
    if threads < 2 or sum(size for _, size, _ in jobs) < _PARALLEL_LOAD_BYTES:
        for job in jobs:
            read(reader, job)
        return out
    todo = iter(sorted(jobs, key=lambda j: -j[1]))
    failed = threading.Event()

    def next_job():
        with lock:
            return None if failed.is_set() else next(todo, None)

    def work(r: ContainerReader) -> None:
        try:
            while (job := next_job()) is not None:
                read(r, job)
        except BaseException:
            failed.set()
            raise

    def helper() -> None:
        with ContainerReader(path, limits=limits) as r:
            work(r)

    with concurrent.futures.ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="reproarchive-load") as pool:
        helpers = [pool.submit(helper) for _ in range(threads - 1)]
        try:
            work(reader)
        finally:
            concurrent.futures.wait(helpers)
        for h in helpers:
            h.result()
    return out


def input_fidelity(rec: Any, storages: Sequence[StorageRecord], targets: Sequence[Any] = ()) -> str:
    """``real`` or ``absent`` for an input with tensor data (absent if any of it is, or was loaded
    onto ``meta`` by ``targets``: a compile-only replay reads no data), else ``value``."""
    found = {FIDELITY_ABSENT if targets and targets[t.storage] is not None and targets[t.storage].type == "meta"
             else storages[t.storage].fidelity for t in rec.tensors()}
    if FIDELITY_ABSENT in found:
        return FIDELITY_ABSENT
    return FIDELITY_REAL if found else "value"


@_torch_errors_as_archive_errors
def read_input(path: str | os.PathLike, which: int | str, *, device=None) -> Any:
    """One input without loading the rest: reads the footer, the index and that input's blobs."""
    with ContainerReader(path) as reader:
        index = reader.index
        mapper = resolve_devices(recorded_devices(index), device, missing="cpu")
        if isinstance(which, str):
            matches = [i for i, r in enumerate(index.inputs) if getattr(r, "name", None) == which]
            if not matches:
                raise IndexSchemaError(f"no input named {which!r}", "see `reproarchive inspect` for input names")
            which = matches[0]
        if not -len(index.inputs) <= which < len(index.inputs):
            raise IndexSchemaError(f"the archive has {len(index.inputs)} inputs, no input {which}",
                                   "see `reproarchive inspect` for the inputs")
        rec = index.inputs[which]
        # a size or stride of another input (§6.3, 1.3): read that input, and compute it from it
        stored = index.inputs[rec.input] if isinstance(rec, DerivedValue) else rec
        records = index.storages
        tensors = list(stored.tensors())
        devs = [torch.device(mapper(r.device)) for r in records]
        needed = sorted({t.storage for t in tensors})
        check_declared_memory((records[i].size, devs[i]) for i in needed)
        storages = _materialize(reader, records, sorted({t.storage for t in tensors}), devs,
                                tensor_codec.storage_dtypes(tensors), None, path=path, limits=reader.limits,
                                demands=storage_demands(index.inputs, records, index.graph))
        value = tensor_codec.ValueDecoder(storages, devs).decode(stored)
        return tensor_codec.derived_value(rec, value) if stored is not rec else value

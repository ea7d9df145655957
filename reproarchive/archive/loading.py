"""``load`` and ``read_input``: archive bytes -> records -> a GraphModule and its inputs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from reproarchive.format import digests, layout
from reproarchive.format.layout import Limits
from reproarchive.format.reader import ContainerReader
from reproarchive.format.parallel import worker_threads
from reproarchive.format.prefault import prefault
from reproarchive.codec import graphs as graph_codec, tensors as tensor_codec
from reproarchive.codec.devices import loader_mapping, remap_graph_devices
from reproarchive.codec.tensors import FIDELITY_ABSENT, FIDELITY_REAL, storage_view
from reproarchive.errors import (
    IndexSchemaError,
    LimitExceededError,
)
from reproarchive.progress import bar
from reproarchive.archive.validation import validate_index


# --------------------------------------------------------------------------------------------
# load


@dataclasses.dataclass
class Repro:
    """A loaded archive: the rebuilt graph, its inputs on the target device, and the records."""

    gm: fx.GraphModule
    args: list
    path: Path
    digest: str
    index: dict
    fidelity: list[str]
    devices: dict[str, str]
    warnings: list[str]

    def _section(self, key: str):
        return self.index.get(key)

    config = property(lambda self: self._section("config"))
    environment = property(lambda self: self._section("environment"))
    system = property(lambda self: self._section("system"))
    failure = property(lambda self: self._section("failure"))
    source = property(lambda self: self._section("source"))
    backend = property(lambda self: self._section("backend"))
    accuracy = property(lambda self: self._section("accuracy"))
    metadata = property(lambda self: self._section("metadata"))
    minify = property(lambda self: self._section("minify"))
    parent = property(lambda self: self._section("parent"))


def _storage_dtypes(index: dict) -> dict[int, torch.dtype]:
    """The dtype of the first tensor viewing each storage (to generate absent data sensibly)."""
    found: dict[int, torch.dtype] = {}

    def visit(rec):
        if isinstance(rec, dict):
            if rec.get("kind") == "tensor":
                found.setdefault(rec["storage"], tensor_codec.dtype_from_name(rec["dtype"]))
            for v in rec.values():
                if isinstance(v, (dict, list)):
                    visit(v)
        elif isinstance(rec, list):
            for v in rec:
                visit(v)

    visit(index["inputs"])
    visit(index["graph"])
    return found


def _torch_errors_as_archive_errors(fn):
    """After validation, load only allocates and builds tensors and a graph from the records, so
    a torch error there means the records ask for something this process cannot build: report
    it as the archive's defect (one line), not as a traceback from inside torch."""
    import functools

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
def load(path: str | os.PathLike, *, device=None, progress: bool | None = None, limits: Limits = layout.DEFAULT_LIMITS,
         remap_graph: bool = True) -> Repro:
    """Rebuild the graph and its inputs from an archive, on ``device``.

    ``device=None`` keeps each storage's recorded device where this machine has it and falls
    back to CPU with a warning; a string moves everything there; a mapping such as
    ``{"cuda:0": "cpu"}`` or ``{"cuda": "cuda:1"}`` remaps by exact device or device type.
    Inputs recorded as absent get seeded generated data and a loud warning. Device constants
    inside the graph follow the same mapping unless ``remap_graph=False`` (``export`` writes
    them as recorded, for its script to map).
    """
    notes: list[str] = []
    mapper = loader_mapping(device)
    with ContainerReader(path, limits=limits) as reader:
        index = validate_index(reader)
        records = index["storages"]
        targets_by_storage = []
        devices: dict[str, str] = {}
        for rec in records:
            target = mapper(rec["device"])
            if device is None and target != rec["device"] and torch.device(rec["device"]).type != "meta":
                notes.append(f"recorded device {rec['device']} is not available here; loading on {target}")
            devices[rec["device"]] = target
            targets_by_storage.append(torch.device(target))
        total = sum(r["size"] for r in records if r["digest"])
        with bar(total, "load", enabled=progress) as pbar:
            storages = _materialize(reader, records, range(len(records)), targets_by_storage, _storage_dtypes(index),
                                    pbar.update, path=path, limits=limits)
        decoder = tensor_codec.ValueDecoder(storages, records, targets_by_storage)
        # Device constants inside the graph follow the inputs (a CUDA graph loaded on CPU
        # must not still create tensors on cuda).
        gm = graph_codec.GraphDecoder(decoder.decode).decode(index["graph"])
        if remap_graph:
            remap_graph_devices(gm, mapper)
        args = [decoder.decode(r) for r in index["inputs"]]
        fidelity = [_fidelity(r, records) for r in index["inputs"]]
        absent = [i for i, f in enumerate(fidelity) if f == FIDELITY_ABSENT]
        if absent:
            names = ", ".join(str(index["inputs"][i].get("name") or i) for i in absent[:8])
            msg = (f"{len(absent)} input(s) had no data in the archive ({names}); "
                   "they were filled with generated values, so the replay is not the original run")
            warnings.warn(msg, stacklevel=3)
            notes.append(msg)
        if device is None:
            for note in dict.fromkeys(n for n in notes if n.startswith("recorded device")):
                warnings.warn(note, stacklevel=3)
        return Repro(gm, args, Path(path), reader.index_digest, index, fidelity, devices, notes)


def _materialize(reader: ContainerReader, records: list[dict], which, devices: list[torch.device],
                 dtypes: dict[int, torch.dtype], progress, *, path, limits: Limits) -> list:
    """Storages ``which`` of the storage table, on their devices (others stay None).

    Each distinct blob is decompressed once; a storage that merely has the same bytes as an
    earlier one gets its own copy (it was a storage of its own when packed); all-zero storages
    need no blob; absent ones get seeded generated data.
    """
    which = list(which)
    first_use: dict[str, int] = {}
    for i in which:
        if records[i]["digest"] is not None:
            first_use.setdefault(records[i]["digest"], i)
    blobs = _read_blobs(reader, [(dg, records[i]["size"], devices[i]) for dg, i in first_use.items()], progress,
                        path=path, limits=limits)
    storages: list = [None] * len(records)
    for i in which:
        rec, dev = records[i], devices[i]
        if rec["fidelity"] == FIDELITY_ABSENT:
            st = torch.empty(rec["size"], dtype=torch.uint8, device=dev).untyped_storage()
            tensor_codec.generate_absent(st, dtypes.get(i, torch.uint8), tensor_codec.ABSENT_SEED + i)
        elif rec["fill"] == 0:
            st = torch.zeros(rec["size"], dtype=torch.uint8, device=dev).untyped_storage()
        else:
            st = blobs[rec["digest"]]
            if first_use[rec["digest"]] != i:
                st = st.clone() if st.device == dev else st.to(device=dev)
                if progress is not None:
                    progress(rec["size"])
        storages[i] = st
    return storages


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


def _fidelity(rec: dict, storages: list[dict]) -> str:
    if rec["kind"] == "tensor":
        return storages[rec["storage"]]["fidelity"]
    if rec["kind"] in ("tuple", "list"):
        inner = {_fidelity(r, storages) for r in rec["items"]}
        return FIDELITY_ABSENT if FIDELITY_ABSENT in inner else (FIDELITY_REAL if FIDELITY_REAL in inner else "value")
    return "value"


@_torch_errors_as_archive_errors
def read_input(path: str | os.PathLike, which: int | str, *, device=None) -> Any:
    """One input without loading the rest: reads the footer, the index and that input's blobs."""
    mapper = loader_mapping(device)
    with ContainerReader(path) as reader:
        index = validate_index(reader)
        inputs = index["inputs"]
        if isinstance(which, str):
            matches = [i for i, r in enumerate(inputs) if r.get("name") == which]
            if not matches:
                raise IndexSchemaError(f"no input named {which!r}", "see `reproarchive inspect` for input names")
            which = matches[0]
        rec = inputs[which]
        records = index["storages"]
        needed = set()

        def visit(r):
            if r["kind"] == "tensor":
                needed.add(r["storage"])
            for item in r.get("items", []):
                visit(item)

        visit(rec)
        devs = [torch.device(mapper(r["device"])) for r in records]
        dtypes = _storage_dtypes({"inputs": [rec], "graph": {}})
        storages = _materialize(reader, records, sorted(needed), devs, dtypes, None, path=path, limits=reader.limits)
        return tensor_codec.ValueDecoder(storages, records, devs).decode(rec)

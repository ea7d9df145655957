"""``pack``: a GraphModule and its inputs -> records -> one archive file.

Packing hashes storages ahead of the one being written while its frames are encoded
(hashlib, xxhash and zstd all release the GIL), one thread per core this process may use,
so the stages overlap instead of adding up.
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
import torch.fx as fx

from reproarchive.format import digests, frames, layout
from reproarchive.format.writer import ContainerWriter
from reproarchive.format.atomic import atomic_file
from reproarchive.format.parallel import WorkQueue, worker_threads
from reproarchive.codec import graphs as graph_codec, tensors as tensor_codec
from reproarchive.codec.tensors import FIDELITY_REAL, StorageTable, storage_view
from reproarchive.errors import (
    PackError,
)
from reproarchive.progress import bar


GRAPH_CODE_MEMBER = "graph.py"
RECORD_SECTIONS = ("config", "environment", "system", "failure", "source", "minify", "metadata")
_ZERO_PROBE = 4096


# --------------------------------------------------------------------------------------------
# pack


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """Records must be plain msgpack data; say which key is not, instead of a msgpack error."""
    if depth > 32:
        raise PackError(f"{where} nests too deeply")
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        if isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 64):
            raise PackError(f"{where} holds an integer that does not fit in 64 bits")
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise PackError(f"{where} has a non-string key {k!r}")
            out[k] = _plain(v, f"{where}.{k}", depth + 1)
        return out
    raise PackError(f"{where} holds a {type(value).__name__}, which a record cannot store", "convert it to plain data")


def _host_bytes(storage: torch.UntypedStorage):
    """Bytes of a storage on the host: zero-copy for CPU, one copy for device storages."""
    if storage.device.type != "cpu":
        storage = storage.cpu()
    return storage, storage_view(storage)


def _is_zero(view: memoryview) -> bool:
    if len(view) == 0:
        return False
    head, tail = bytes(view[:_ZERO_PROBE]), bytes(view[-_ZERO_PROBE:])
    if head.count(0) != len(head) or tail.count(0) != len(tail):
        return False
    return not bool(torch.frombuffer(view, dtype=torch.uint8).any())


def _digest_job(storage: torch.UntypedStorage, algorithm: str):
    keep, view = _host_bytes(storage)
    if _is_zero(view):
        return keep, view, None
    h = digests.new_hasher(algorithm)
    h.update(view)
    return keep, view, f"{algorithm}:{h.hexdigest()}"


def pack(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    path: str | os.PathLike,
    *,
    config: Mapping | None = None,
    environment: Mapping | None = None,
    system: Mapping | None = None,
    failure: Mapping | None = None,
    source: Mapping | None = None,
    backend: str | None = None,
    accuracy: bool | None = None,
    parent: str | None = None,
    minify: Mapping | None = None,
    digest: str = digests.DEFAULT_ALGORITHM,
    level: int = layout.DEFAULT_LEVEL,
    frame_size: int = layout.DEFAULT_FRAME_SIZE,
    min_saving: float = frames.MIN_SAVING,
    progress: bool | None = None,
    **metadata: Any,
) -> Path:
    """Write ``gm`` and one example input per placeholder to ``path`` (atomically).

    Data frames that zstd ``level`` would shrink by less than ``min_saving`` are stored
    uncompressed (cheaper to write and to read); ``min_saving=0`` compresses every frame.
    """
    if not isinstance(gm, fx.GraphModule):
        raise PackError(f"pack needs a torch.fx.GraphModule, got {type(gm).__name__}")
    digests.check_algorithm(digest)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = list(example_inputs)
    if len(inputs) != len(placeholders):
        raise PackError(
            f"graph has {len(placeholders)} placeholders but {len(inputs)} example inputs were given",
            "pass exactly one example input per placeholder, in order",
        )
    if parent is not None:
        digests.parse(parent)
    table = StorageTable()
    input_records = [
        tensor_codec.encode_value(v, table, name=n.name, dynamic=graph_codec.dynamic_dims(n))
        for n, v in zip(placeholders, inputs)
    ]
    graph_record = graph_codec.encode_graph(gm, table)
    code = graph_codec.readable_code(gm).encode()
    index: dict[str, Any] = {
        "digest_algorithm": digest,
        "graph": graph_record,
        "inputs": input_records,
        "storages": table.records,
        "backend": backend,
        "accuracy": accuracy,
        "parent": parent,
        "created_by": {"reproarchive": _version(), "torch": torch.__version__.split("+")[0]},
    }
    sections = {"config": config, "environment": environment, "system": system, "failure": failure,
                "source": source, "minify": minify, "metadata": metadata or None}
    for key, value in sections.items():
        index[key] = None if value is None else _plain(dict(value), key)
    if backend is not None and not isinstance(backend, str):
        raise PackError("backend must be a string naming the compiler backend")

    real = [i for i, r in enumerate(table.records) if r["fidelity"] == FIDELITY_REAL]
    # the bar counts member bytes as their frames reach the file, and skipped storages at once
    total = sum(table.records[i]["size"] for i in real) + len(code) + len(layout.layout_bytes())
    threads = worker_threads()
    # Storages are hashed ahead of the one being compressed (the digest names the blob, so it
    # must be known before its first frame is written). CPU storages are hashed in place, so
    # looking further ahead costs no memory; a device storage costs a host copy while queued.
    ahead = 2 * threads if all(table.sources[i].device.type == "cpu" for i in real) else 1
    # One thread per core this process may use, this one included: it hashes and encodes too
    # whenever it would otherwise wait (WorkQueue), so a busy core never holds up the others.
    with atomic_file(path) as f, bar(total, "pack", enabled=progress) as pbar, \
            WorkQueue(threads - 1, name="reproarchive-pack") as pool:
        writer = ContainerWriter(f, level=level, frame_size=frame_size, executor=pool,
                                 progress=pbar.update, direct_io=True, min_saving=min_saving)
        try:
            writer.add_member(GRAPH_CODE_MEMBER, code)
            written: set[str] = set()
            pending: dict[int, concurrent.futures.Future] = {}

            def submit(k: int) -> None:
                if k < len(real) and k not in pending:
                    pending[k] = pool.submit(_digest_job, table.sources[real[k]], digest)

            for k in range(ahead):
                submit(k)
            for k, sidx in enumerate(real):
                submit(k + ahead)
                keep, view, dg = pending.pop(k).result()
                record = table.records[sidx]
                if dg is None:
                    record["fill"] = 0
                    pbar.update(record["size"])
                else:
                    record["digest"] = dg
                    if dg not in written:
                        writer.add_member(digests.blob_member_name(dg), view, keep=keep)
                        written.add(dg)
                    else:
                        pbar.update(record["size"])
                del keep, view
            writer.finish(index)
        except BaseException:
            writer.abandon()
            for fut in pending.values():
                fut.cancel()
            raise
    return Path(path)


def _version() -> str:
    from reproarchive.version import __version__

    return __version__
